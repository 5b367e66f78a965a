// Command kube-controller-manager is the upstream kube-controller-manager entry point, built from
// the pinned k8s.io/kubernetes module (garbage collector, namespace controller, token controllers…).
package main

import (
	"os"
	_ "time/tzdata" // time-zone database for CronJobs, as upstream embeds it

	"k8s.io/component-base/cli"
	_ "k8s.io/component-base/logs/json/register"          // --logging-format=json
	_ "k8s.io/component-base/metrics/prometheus/clientgo" // client-go metrics
	_ "k8s.io/component-base/metrics/prometheus/version"  // version metric
	"k8s.io/kubernetes/cmd/kube-controller-manager/app"
)

func main() {
	os.Exit(cli.Run(app.NewControllerManagerCommand()))
}
