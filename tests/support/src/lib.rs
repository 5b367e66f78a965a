//! A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager) for tests.
