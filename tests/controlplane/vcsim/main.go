// Command vcsim serves govmomi's vSphere API simulator (package simulator of the pinned govmomi
// release). Upstream's own vcsim main lives in a nested module (github.com/vmware/govmomi/vcsim)
// that the Go module proxy does not serve, so this is a small equivalent with the flags banlieue's
// tests use. It prints `export GOVC_URL=… GOVC_SIM_PID=…` once listening, and runs until SIGINT or
// SIGTERM (or until stdin closes, with -stdinexit).
package main

import (
	"crypto/tls"
	"flag"
	"fmt"
	"io"
	"log"
	"net/url"
	"os"
	"os/signal"
	"syscall"

	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vim25/types"

	// Optional endpoints (REST/vAPI, tagging, storage policy, lookup, STS, …) register themselves.
	_ "github.com/vmware/govmomi/cns/simulator"
	_ "github.com/vmware/govmomi/eam/simulator"
	_ "github.com/vmware/govmomi/lookup/simulator"
	_ "github.com/vmware/govmomi/pbm/simulator"
	_ "github.com/vmware/govmomi/ssoadmin/simulator"
	_ "github.com/vmware/govmomi/sts/simulator"
	_ "github.com/vmware/govmomi/vapi/simulator"
	_ "github.com/vmware/govmomi/vsan/simulator"
)

func main() {
	model := simulator.VPX()
	flag.IntVar(&model.Datacenter, "dc", model.Datacenter, "number of datacenters")
	flag.IntVar(&model.Cluster, "cluster", model.Cluster, "number of clusters per datacenter")
	flag.IntVar(&model.ClusterHost, "host", model.ClusterHost, "number of hosts per cluster")
	flag.IntVar(&model.Host, "standalone-host", model.Host, "number of standalone hosts")
	flag.IntVar(&model.Datastore, "ds", model.Datastore, "number of local datastores")
	flag.IntVar(&model.Machine, "vm", model.Machine, "number of virtual machines per resource pool")
	flag.IntVar(&model.Pool, "pool", model.Pool, "number of resource pools per compute resource")
	flag.IntVar(&model.Folder, "folder", model.Folder, "number of folders")
	flag.IntVar(&model.Portgroup, "pg", model.Portgroup, "number of port groups")
	flag.BoolVar(&model.Autostart, "autostart", model.Autostart, "power on the model's VMs")
	listen := flag.String("l", "127.0.0.1:8989", "listen address (port 0 picks a free port)")
	useTLS := flag.Bool("tls", true, "serve HTTPS (with a generated self-signed certificate unless -tlscert)")
	certFile := flag.String("tlscert", "", "TLS certificate file (PEM)")
	keyFile := flag.String("tlskey", "", "TLS key file (PEM)")
	user := flag.String("username", "", "the only accepted user name (default: any)")
	pass := flag.String("password", "", "the only accepted password (default: any)")
	envOut := flag.String("E", "-", "write the export line to this file instead of stdout")
	stdinExit := flag.Bool("stdinexit", false, "exit when stdin is closed")
	roleUser := flag.String("role-user", "", "a second user whose calls are checked against -role-privileges (vCenter's privilege checks; see privileges.go)")
	rolePass := flag.String("role-password", "", "the password of -role-user")
	rolePrivileges := flag.String("role-privileges", "", "comma-separated privileges of -role-user's role")
	flag.Parse()

	u := &url.URL{Host: *listen}
	if *user != "" {
		u.User = url.UserPassword(*user, *pass)
	}
	if err := model.Create(); err != nil {
		log.Fatalf("creating the inventory: %v", err)
	}
	defer model.Remove()

	model.Service.RegisterEndpoints = true
	model.Service.Listen = u
	if *useTLS {
		model.Service.TLS = new(tls.Config)
		if *certFile != "" {
			pair, err := tls.LoadX509KeyPair(*certFile, *keyFile)
			if err != nil {
				log.Fatalf("loading -tlscert/-tlskey: %v", err)
			}
			model.Service.TLS.Certificates = []tls.Certificate{pair}
		}
	}
	server := model.Service.NewServer()
	defer server.Close()
	if *roleUser != "" {
		// After NewServer: the SSO admin endpoint installs its own login check there, which
		// still decides for every other user.
		check := newRoleCheck(*roleUser, *rolePrivileges)
		model.Map().Handler = check.handle
		sessions := model.Map().SessionManager()
		others := sessions.ValidLogin
		sessions.ValidLogin = func(req *types.Login) bool {
			if req.UserName == *roleUser {
				return req.Password == *rolePass
			}
			if others != nil {
				return others(req)
			}
			return req.UserName == *user && req.Password == *pass
		}
	}

	out := io.Writer(os.Stdout)
	if *envOut != "-" {
		f, err := os.OpenFile(*envOut, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
		if err != nil {
			log.Fatalf("opening -E file: %v", err)
		}
		defer f.Close()
		out = f
	}
	if _, err := fmt.Fprintf(out, "export GOVC_URL=%s GOVC_SIM_PID=%d\n", server.URL, os.Getpid()); err != nil {
		log.Fatalf("writing the export line: %v", err)
	}

	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGINT, syscall.SIGTERM)
	if *stdinExit {
		go func() {
			_, _ = io.Copy(io.Discard, os.Stdin)
			stop <- syscall.SIGTERM
		}()
	}
	<-stop
}
