// Command kubeadm is the upstream kubeadm entry point, built from the pinned k8s.io/kubernetes
// module: it runs inside the guests of the workload-cluster tests, from CAPI's bootstrap data.
package main

import (
	"k8s.io/kubernetes/cmd/kubeadm/app"
	kubeadmutil "k8s.io/kubernetes/cmd/kubeadm/app/util"
)

func main() {
	kubeadmutil.CheckErr(app.Run())
}
