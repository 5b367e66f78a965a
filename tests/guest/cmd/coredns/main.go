// Command coredns is CoreDNS with its default plugin set at the version kubeadm 1.33 deploys
// (1.12.0), built from its module for the lab guest image (tests/guest/build.sh).
package main

import (
	_ "github.com/coredns/coredns/core/plugin" // the default plugins (zplugin.go)
	"github.com/coredns/coredns/coremain"
)

func main() {
	coremain.Run()
}
