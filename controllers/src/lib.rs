//! The banlieue controller: standalone VirtualMachines over any provider.
//!
//! A user creates a hypervisor-neutral `VirtualMachine`; this controller creates and patches
//! the matching infrastructure machine (e.g. a `ProxmoxMachine`) through a data-driven
//! [`registry`], the provider acts on it and writes its status, and the controller mirrors
//! that status up to the VirtualMachine ([`mirror`]). Every arrow is a Kubernetes API call.
//!
//! Modules: [`registry`] (backend → kind table), [`build`] (pure: provider choice, class and
//! image resolution, the desired machine and infra cluster), [`mirror`] (pure: machine status
//! → VirtualMachine status), [`finalizer`] (the VirtualMachine finalizer's patches),
//! [`provider_use`] (pure: who uses a Provider, its capacity), [`provider_health`] (pure: a
//! Provider's `Ready` and version from its infrastructure clusters) and [`provider_controller`]
//! (a Provider in use is not deleted; its status),
//! [`infra_cluster`] (the infra cluster object per Provider and namespace), [`served`] (which
//! providers' kinds are installed), [`controller`] (the kube-runtime reconciler). The crate also renders the CRDs for
//! the `banlieue crds` subcommand.

pub mod build;
pub mod controller;
pub mod finalizer;
pub mod http;
pub mod infra_cluster;
pub mod leader;
pub mod mirror;
pub mod provider_controller;
pub mod provider_health;
pub mod provider_use;
pub mod rbac;
pub mod registry;
pub mod served;

/// Errors of the banlieue CLI.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A CRD or admission policy could not be rendered as YAML.
    #[error("rendering {name} as YAML")]
    Render {
        /// Name of the CRD.
        name: String,
        /// The serializer's error.
        #[source]
        source: serde_yaml::Error,
    },
    /// A Kubernetes API call failed.
    #[error("{context}")]
    Kube {
        /// What the controller was doing.
        context: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A patch the controller built is not a valid JSON patch (a bug).
    #[error("building the patch for {context}")]
    Patch {
        /// What the patch was for.
        context: String,
        /// The deserializer's error.
        #[source]
        source: serde_json::Error,
    },
    /// A reconcile did not finish in time (a hung API call).
    #[error("reconciling took longer than {0:?}")]
    Timeout(std::time::Duration),
}

impl Error {
    /// A [`Error::Kube`] with context.
    pub fn kube(context: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube {
            context: context.into(),
            source,
        }
    }

    /// A short, stable label for metrics and logs.
    pub fn metric_label(&self) -> &'static str {
        match self {
            Self::Render { .. } => "render",
            Self::Kube { .. } => "kube",
            Self::Patch { .. } => "patch",
            Self::Timeout(_) => "timeout",
        }
    }
}

/// Result with this crate's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Renders every banlieue CRD as one multi-document YAML stream, each document introduced by
/// `---`, in the order of [`banlieue_api::crds::all`], followed by the admission policies the
/// CRDs need ([`admission_policies_yaml`]): what `banlieue crds` prints.
pub fn all_crds_yaml() -> Result<String> {
    let mut out = String::new();
    for crd in banlieue_api::crds::all() {
        let yaml = banlieue_api::crds::to_yaml(&crd).map_err(|source| Error::Render {
            name: crd.metadata.name.clone().unwrap_or_default(),
            source,
        })?;
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    out.push_str(&admission_policies_yaml()?);
    Ok(out)
}

/// The `ValidatingAdmissionPolicy` objects and bindings of [`banlieue_api::policies::all`]
/// (machine template immutability that CAPI's topology dry-runs may pass), as YAML documents
/// each introduced by `---`.
pub fn admission_policies_yaml() -> Result<String> {
    let mut out = String::new();
    for doc in banlieue_api::policies::all() {
        let yaml = serde_yaml::to_string(&doc).map_err(|source| Error::Render {
            name: doc["metadata"]["name"].as_str().unwrap_or_default().to_owned(),
            source,
        })?;
        out.push_str("---\n");
        out.push_str(&yaml);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

    use super::*;

    #[test]
    fn stream_has_one_document_per_crd_in_order() {
        let yaml = all_crds_yaml().expect("renders");
        let policies = admission_policies_yaml().expect("renders");
        let crds = yaml.strip_suffix(&policies).expect("the policies come last");
        assert_eq!(
            policies.matches("---\n").count(),
            banlieue_api::policies::all().len()
        );
        let names: Vec<String> = crds
            .split("---\n")
            .filter(|d| !d.is_empty())
            .map(|doc| {
                let crd: CustomResourceDefinition =
                    serde_yaml::from_str(doc).expect("each document is a CRD");
                crd.metadata.name.expect("named")
            })
            .collect();
        let expected: Vec<String> = banlieue_api::crds::all()
            .into_iter()
            .map(|c| c.metadata.name.expect("named"))
            .collect();
        assert_eq!(names, expected);
    }
}
