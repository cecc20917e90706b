// Command etcd is the etcd server of the pinned go.etcd.io/etcd/server/v3 release, for `make cluster`.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
