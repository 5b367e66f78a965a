//! Where Cluster API's admission webhook configurations are: `api/capi/webhooks/` in this
//! repository (CAPI v1.14.2, Apache-2.0, see its README), or the folder named by [`DIR_ENV`].
//!
//! One file per CAPI manager; each lists the paths of that manager's webhook server and the kinds
//! they default and validate. The local environment registers them for the managers it runs.

use std::path::{Path, PathBuf};

/// Environment variable naming another folder of webhook configurations.
pub const DIR_ENV: &str = "BANLIEUE_CAPI_WEBHOOKS";

/// One of CAPI's managers with admission webhooks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Manager {
    /// The core manager (Cluster, Machine, MachineDeployment, ClusterClass, …).
    Core,
    /// The kubeadm bootstrap provider (KubeadmConfig, KubeadmConfigTemplate).
    KubeadmBootstrap,
    /// The kubeadm control-plane provider (KubeadmControlPlane and its template).
    KubeadmControlPlane,
}

impl Manager {
    /// Every manager, in the order CAPI installs them.
    pub const ALL: [Manager; 3] = [
        Manager::Core,
        Manager::KubeadmBootstrap,
        Manager::KubeadmControlPlane,
    ];

    /// The file of its webhook configurations in [`dir`].
    pub fn file_name(self) -> &'static str {
        match self {
            Manager::Core => "core.yaml",
            Manager::KubeadmBootstrap => "kubeadm-bootstrap.yaml",
            Manager::KubeadmControlPlane => "kubeadm-control-plane.yaml",
        }
    }

    /// The prefix CAPI's release manifests give its objects (`capi-mutating-webhook-configuration`,
    /// …).
    pub fn name_prefix(self) -> &'static str {
        match self {
            Manager::Core => "capi",
            Manager::KubeadmBootstrap => "capi-kubeadm-bootstrap",
            Manager::KubeadmControlPlane => "capi-kubeadm-control-plane",
        }
    }
}

/// The folder of the webhook configurations: `$BANLIEUE_CAPI_WEBHOOKS`, else the repository's
/// `api/capi/webhooks`.
pub fn dir() -> PathBuf {
    std::env::var_os(DIR_ENV).map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("webhooks"),
        PathBuf::from,
    )
}

/// The file of `manager`'s webhook configurations.
pub fn file(manager: Manager) -> PathBuf {
    dir().join(manager.file_name())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_manager_has_its_mutating_and_validating_configurations() {
        for manager in Manager::ALL {
            let text = std::fs::read_to_string(file(manager)).unwrap_or_else(|e| panic!("{manager:?}: {e}"));
            for kind in ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"] {
                assert!(text.contains(&format!("kind: {kind}")), "{manager:?}: no {kind}");
            }
        }
        assert!(
            std::fs::read_to_string(file(Manager::Core))
                .unwrap()
                .contains("path: /mutate-cluster-x-k8s-io-v1beta2-machinedeployment")
        );
    }
}
