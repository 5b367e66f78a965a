// Command etcd is etcd's own entry point at the version kubeadm 1.33 deploys (3.5.24), built from
// its module for the lab guest image (tests/guest/build.sh): the harness's control plane keeps
// its own pin (tests/controlplane).
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() {
	etcdmain.Main(os.Args)
}
