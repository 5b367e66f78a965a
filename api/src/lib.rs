//! banlieue's Kubernetes API types: VirtualMachine, Provider, classes, images and the per-hypervisor infrastructure kinds.
