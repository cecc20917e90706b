"""The `trainyard` command line, packaged alone (`pip install ./cli`): a client of the REST API only."""
