//! banlieue-vsphere: the Cluster API v1beta2 infrastructure provider for VMware vSphere.
