// Module vcsim builds govmomi's vSphere API simulator from the pinned govmomi release.
module banlieue.dev/tests/controlplane/vcsim

go 1.25.0

require github.com/vmware/govmomi v0.55.0

require (
	github.com/google/uuid v1.6.0 // indirect
	golang.org/x/text v0.38.0 // indirect
)
