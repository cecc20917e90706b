module trainyard.io/tyexec

go 1.22
