//! A `Provider` labelled [`MOVE_LABEL`] (clusterctl's `move-hierarchy`) owns the objects it names
//! (its credentials Secret and CA bundle), so that `clusterctl move` takes them along: clusterctl
//! copies such a Provider to the target management cluster with what it owns (kept on the
//! source, as CAPV's cluster identities), but it sees an object as a Provider's only through an
//! owner reference. A Provider without the label owns nothing, and every move leaves it alone.
//!
//! An owner reference would also let the garbage collector delete the Secret with the Provider,
//! and a Secret may be shared (the one `clusterctl init` creates serves clusters too). So the
//! Provider keeps [`REFERENCES_FINALIZER`] while it owns anything, and its deletion takes its
//! owner references off first. What it owns is recorded in [`OWNED_REFERENCES_ANNOTATION`], so
//! that a changed reference (or the label removed) releases the object named before. A
//! *foreground* deletion (`kubectl delete --cascade=foreground`, Argo CD's default prune) lets the
//! garbage collector delete the dependents before any finalizer runs: the documentation says so.
//!
//! The provider of each backend does this for the Providers of its backend (it is the one
//! allowed to read and patch Secrets). Objects are read as metadata only: nothing of a Secret's
//! data is fetched here.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use banlieue_api::banlieue::{
    Backend, MOVE_LABEL, OWNED_REFERENCES_ANNOTATION, Provider, REFERENCES_FINALIZER,
};
use banlieue_api::common::CaBundleKind;
use banlieue_provider_runtime::metrics::Metrics;
use k8s_openapi::api::core::v1::{ConfigMap, Secret};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde_json::json;
use tracing::{info, instrument, warn};

use crate::error::{Error, Result};

/// How often a Provider is looked at again without a change (a Secret deleted and created
/// again lost its owner reference).
pub const RECHECK: Duration = Duration::from_secs(600);
/// Delay before a failed reconcile is tried again.
pub const RETRY: Duration = Duration::from_secs(15);

/// The kind of an owned object.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum OwnedKind {
    /// A Secret (credentials, CA bundle).
    Secret,
    /// A ConfigMap (CA bundle).
    ConfigMap,
}

impl OwnedKind {
    fn as_str(self) -> &'static str {
        match self {
            Self::Secret => "Secret",
            Self::ConfigMap => "ConfigMap",
        }
    }
}

/// An object a Provider names.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Owned {
    /// Its kind.
    pub kind: OwnedKind,
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
}

impl std::fmt::Display for Owned {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}/{}", self.kind.as_str(), self.namespace, self.name)
    }
}

impl Owned {
    /// Reads one entry of [`OWNED_REFERENCES_ANNOTATION`]; `None` for anything else.
    fn parse(entry: &str) -> Option<Self> {
        let (kind, path) = entry.trim().split_once(' ')?;
        let kind = match kind {
            "Secret" => OwnedKind::Secret,
            "ConfigMap" => OwnedKind::ConfigMap,
            _ => return None,
        };
        let (namespace, name) = path.trim().split_once('/')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains('/')).then(|| Self {
            kind,
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }
}

/// The objects `provider` must own: its credentials Secret and CA bundle (each needs a
/// namespace, which the Provider's validation requires) while it carries [`MOVE_LABEL`].
pub fn named(provider: &Provider) -> BTreeSet<Owned> {
    if !provider.labels().contains_key(MOVE_LABEL) {
        return BTreeSet::new();
    }
    let credentials = provider.spec.credentials_ref.as_ref().and_then(|r| {
        Some(Owned {
            kind: OwnedKind::Secret,
            namespace: r.namespace.clone()?,
            name: r.name.clone(),
        })
    });
    let ca_bundle = provider
        .spec
        .tls
        .as_ref()
        .and_then(|t| t.ca_bundle_ref.as_ref())
        .and_then(|r| {
            Some(Owned {
                kind: match r.kind {
                    CaBundleKind::Secret => OwnedKind::Secret,
                    CaBundleKind::ConfigMap => OwnedKind::ConfigMap,
                },
                namespace: r.namespace.clone()?,
                name: r.name.clone(),
            })
        });
    credentials.into_iter().chain(ca_bundle).collect()
}

/// The objects `provider`'s annotation records as owned.
pub fn recorded(provider: &Provider) -> BTreeSet<Owned> {
    provider
        .annotations()
        .get(OWNED_REFERENCES_ANNOTATION)
        .map(|value| value.split(',').filter_map(Owned::parse).collect())
        .unwrap_or_default()
}

fn record(owned: &BTreeSet<Owned>) -> String {
    crate::join(owned, ", ")
}

/// What one reconcile of a Provider does, in this order: record and hold (`hold`: the
/// annotation and the finalizer, written before any owner reference so that a crash never
/// leaves an unrecorded one), own, release, then settle the annotation and the finalizer to
/// `keep`.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    /// Recorded before owning: what is recorded plus what will be owned (`None`: no need).
    pub hold: Option<BTreeSet<Owned>>,
    /// Objects that must carry the Provider's owner reference.
    pub own: BTreeSet<Owned>,
    /// Objects whose owner reference to the Provider must go.
    pub release: BTreeSet<Owned>,
    /// The record at the end; the finalizer stays while it is not empty.
    pub keep: BTreeSet<Owned>,
}

/// The plan for `provider`: while it lives it owns what it names and releases what it named
/// before; once deleted it releases everything.
pub fn plan(provider: &Provider) -> Plan {
    let named = named(provider);
    let wanted = if provider.metadata.deletion_timestamp.is_some() {
        BTreeSet::new()
    } else {
        named.clone()
    };
    let recorded = recorded(provider);
    let holding = recorded.union(&wanted).cloned().collect::<BTreeSet<_>>();
    let held = provider.finalizers().iter().any(|f| f == REFERENCES_FINALIZER);
    let hold = (!wanted.is_empty() && (holding != recorded || !held)).then_some(holding);
    // Whatever is recorded or named and no longer wanted (all of it once deleted).
    let release = recorded
        .union(&named)
        .filter(|o| !wanted.contains(o))
        .cloned()
        .collect();
    Plan {
        hold,
        own: wanted.clone(),
        release,
        keep: wanted,
    }
}

/// The owner reference to `provider` (not a controller: a Secret may serve several Providers).
pub fn owner_reference(provider: &Provider) -> OwnerReference {
    OwnerReference {
        api_version: Provider::api_version(&()).into_owned(),
        kind: Provider::kind(&()).into_owned(),
        name: provider.name_any(),
        uid: provider.uid().unwrap_or_default(),
        controller: None,
        block_owner_deletion: None,
    }
}

/// Shared state of the Provider references controller.
pub struct Context {
    /// Kubernetes client.
    pub client: kube::Client,
    /// The backend whose Providers this provider looks after.
    pub backend: Backend,
    /// The provider's metrics registry.
    pub metrics: Metrics,
}

/// Brings one Provider's owner references and record in line with [`plan`]; a Provider of
/// another backend is left alone, and a reconcile with nothing to change writes nothing.
#[instrument(skip_all, fields(provider = provider.name_any()))]
pub async fn reconcile(provider: Arc<Provider>, ctx: Arc<Context>) -> Result<Action> {
    if provider.spec.backend != ctx.backend {
        return Ok(Action::await_change());
    }
    let plan = plan(&provider);
    let api = Api::<Provider>::all(ctx.client.clone());
    let mut current = (*provider).clone();
    if let Some(holding) = &plan.hold {
        current = write_record(&api, &current, holding, true, &ctx.metrics).await?;
    }
    let reference = owner_reference(&provider);
    for object in &plan.own {
        set_owner(&ctx, object, &reference, true).await?;
    }
    for object in &plan.release {
        set_owner(&ctx, object, &reference, false).await?;
    }
    let keep_finalizer = !plan.keep.is_empty();
    let held = current.finalizers().iter().any(|f| f == REFERENCES_FINALIZER);
    if recorded(&current) != plan.keep || held != keep_finalizer {
        write_record(&api, &current, &plan.keep, keep_finalizer, &ctx.metrics).await?;
    }
    Ok(Action::requeue(RECHECK))
}

/// Writes the record annotation (removed when empty) and adds or removes the finalizer, with
/// the Provider's resourceVersion (a concurrent change makes it fail and be tried again).
async fn write_record(
    api: &Api<Provider>,
    provider: &Provider,
    owned: &BTreeSet<Owned>,
    finalizer: bool,
    metrics: &Metrics,
) -> Result<Provider> {
    let finalizers = crate::status::finalizers_with(provider.finalizers(), REFERENCES_FINALIZER, finalizer);
    let annotation = (!owned.is_empty()).then(|| record(owned));
    let patch = json!({
        "metadata": {
            "finalizers": finalizers,
            "annotations": {OWNED_REFERENCES_ANNOTATION: annotation},
            "resourceVersion": provider.resource_version(),
        }
    });
    let name = provider.name_any();
    let written = api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| Error::kube(format!("recording what Provider {name} owns"), e))?;
    metrics.count_write("provider-references");
    Ok(written)
}

/// Adds (`own`) or removes the owner reference `reference` on `object`; a missing object has
/// nothing to change. An object the provider may not patch (a ConfigMap under a role without
/// that right) is logged and left when adding: it would not move, but nothing else depends on
/// it; a refused removal is an error (tried again, the finalizer held).
async fn set_owner(ctx: &Context, object: &Owned, reference: &OwnerReference, own: bool) -> Result<()> {
    let outcome = match object.kind {
        OwnedKind::Secret => set_owner_of::<Secret>(ctx, object, reference, own).await,
        OwnedKind::ConfigMap => set_owner_of::<ConfigMap>(ctx, object, reference, own).await,
    };
    match outcome {
        // Only an owner reference that could not be added is let go: one that cannot be removed
        // must stay recorded (and the finalizer held), or the garbage collector could delete
        // the object with the Provider.
        Err(kube::Error::Api(status)) if status.code == 403 && own => {
            warn!(%object, reason = %status.message, "may not change the owner references of this object: clusterctl move will not take it along with the Provider");
            Ok(())
        }
        Err(e) => Err(Error::kube(
            format!(
                "{} the Provider's owner reference on {object}",
                if own { "adding" } else { "removing" }
            ),
            e,
        )),
        Ok(changed) => {
            if changed {
                ctx.metrics.count_write("provider-references");
                info!(%object, owned = own, "Provider owner reference changed");
            }
            Ok(())
        }
    }
}

async fn set_owner_of<K: banlieue_api::infrastructure::kinds::NamespacedKind>(
    ctx: &Context,
    object: &Owned,
    reference: &OwnerReference,
    own: bool,
) -> kube::Result<bool> {
    let api = Api::<K>::namespaced(ctx.client.clone(), &object.namespace);
    let Some(meta) = api.get_metadata_opt(&object.name).await? else {
        return Ok(false);
    };
    let mut references = meta.metadata.owner_references.clone().unwrap_or_default();
    let present = references.iter().any(|r| r.uid == reference.uid);
    if present == own {
        return Ok(false);
    }
    if own {
        references.push(reference.clone());
    } else {
        references.retain(|r| r.uid != reference.uid);
    }
    let patch = json!({
        "metadata": {
            "ownerReferences": references,
            "resourceVersion": meta.metadata.resource_version,
        }
    });
    api.patch_metadata(&object.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(true)
}

fn error_policy(_provider: Arc<Provider>, error: &Error, _ctx: Arc<Context>) -> Action {
    warn!(%error, "reconciling a Provider's owner references failed; retrying");
    Action::requeue(RETRY)
}

/// Runs the controller until `shutdown`.
pub async fn run(ctx: Arc<Context>, shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static) {
    let metrics = ctx.metrics.clone();
    let controller = Controller::new(
        Api::<Provider>::all(ctx.client.clone()),
        watcher::Config::default(),
    );
    crate::drive::drive(controller, 0, shutdown, metrics, reconcile, error_policy, ctx).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn provider(value: serde_json::Value) -> Provider {
        let mut base = json!({
            "apiVersion": "banlieue.io/v1alpha1", "kind": "Provider",
            "metadata": {"name": "pve", "uid": "u-1", "labels": {MOVE_LABEL: ""}},
            "spec": {
                "backend": "proxmox", "endpoint": "https://pve:8006",
                "credentialsRef": {"name": "token", "namespace": "platform"},
            },
        });
        merge(&mut base, value);
        serde_json::from_value(base).unwrap()
    }

    /// JSON merge patch (RFC 7386): objects merged key by key, `null` removes.
    fn merge(base: &mut serde_json::Value, patch: serde_json::Value) {
        match (base, patch) {
            (serde_json::Value::Object(base), serde_json::Value::Object(patch)) => {
                for (key, value) in patch {
                    if value.is_null() {
                        base.remove(&key);
                    } else {
                        merge(base.entry(key).or_insert(serde_json::Value::Null), value);
                    }
                }
            }
            (base, patch) => *base = patch,
        }
    }

    fn secret(namespace: &str, name: &str) -> Owned {
        Owned {
            kind: OwnedKind::Secret,
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn a_new_provider_records_and_holds_before_it_owns_its_secret_and_ca_bundle() {
        let p = provider(
            json!({"spec": {"tls": {"caBundleRef": {"kind": "ConfigMap", "name": "ca", "namespace": "platform"}}}}),
        );
        let plan = plan(&p);
        let both: BTreeSet<_> = [
            secret("platform", "token"),
            Owned {
                kind: OwnedKind::ConfigMap,
                namespace: "platform".into(),
                name: "ca".into(),
            },
        ]
        .into();
        assert_eq!(plan.hold.as_ref(), Some(&both));
        assert_eq!(plan.own, both);
        assert!(plan.release.is_empty());
        assert_eq!(plan.keep, both);
    }

    #[test]
    fn a_settled_provider_plans_no_record_write() {
        let p = provider(json!({"metadata": {
            "finalizers": [REFERENCES_FINALIZER],
            "annotations": {OWNED_REFERENCES_ANNOTATION: "Secret platform/token"},
        }}));
        let plan = plan(&p);
        assert_eq!(plan.hold, None);
        assert!(plan.release.is_empty());
        assert_eq!(recorded(&p), plan.keep);
    }

    #[test]
    fn a_changed_reference_releases_the_secret_named_before() {
        let p = provider(json!({"metadata": {
            "finalizers": [REFERENCES_FINALIZER],
            "annotations": {OWNED_REFERENCES_ANNOTATION: "Secret platform/old"},
        }}));
        let plan = plan(&p);
        assert_eq!(
            plan.hold,
            Some([secret("platform", "old"), secret("platform", "token")].into())
        );
        assert_eq!(plan.release, [secret("platform", "old")].into());
        assert_eq!(plan.keep, [secret("platform", "token")].into());
    }

    #[test]
    fn a_deleted_provider_releases_everything_and_drops_its_finalizer() {
        let p = provider(json!({"metadata": {
            "deletionTimestamp": "2026-12-06T00:00:00Z",
            "finalizers": [REFERENCES_FINALIZER],
            // Recorded late (a crash between owning and recording cannot happen: the record
            // comes first) or not at all: what it names is released too.
            "annotations": {OWNED_REFERENCES_ANNOTATION: "Secret platform/old"},
        }}));
        let plan = plan(&p);
        assert_eq!(plan.hold, None);
        assert!(plan.own.is_empty());
        assert_eq!(
            plan.release,
            [secret("platform", "old"), secret("platform", "token")].into()
        );
        assert!(plan.keep.is_empty());
    }

    #[test]
    fn a_provider_not_labelled_for_move_owns_nothing_and_releases_what_it_owned() {
        let p = provider(json!({"metadata": {
            "labels": {MOVE_LABEL: null},
            "finalizers": [REFERENCES_FINALIZER],
            "annotations": {OWNED_REFERENCES_ANNOTATION: "Secret platform/token"},
        }}));
        let unlabelled = plan(&p);
        assert_eq!(unlabelled.hold, None);
        assert!(unlabelled.own.is_empty());
        assert_eq!(unlabelled.release, [secret("platform", "token")].into());
        assert!(unlabelled.keep.is_empty());
        let fresh = plan(&provider(json!({"metadata": {"labels": {MOVE_LABEL: null}}})));
        assert_eq!(fresh.hold, None);
        assert!(fresh.own.is_empty());
    }

    #[test]
    fn a_provider_without_references_holds_nothing() {
        let p = provider(json!({"spec": {"backend": "libvirt", "credentialsRef": null}}));
        assert_eq!(
            plan(&p),
            Plan {
                hold: None,
                own: BTreeSet::new(),
                release: BTreeSet::new(),
                keep: BTreeSet::new(),
            }
        );
    }

    #[test]
    fn the_record_reads_back_what_it_wrote_and_ignores_anything_else() {
        let owned: BTreeSet<_> = [secret("a", "x"), secret("b", "y")].into();
        let p = provider(json!({"metadata": {"annotations": {OWNED_REFERENCES_ANNOTATION: record(&owned)}}}));
        assert_eq!(recorded(&p), owned);
        let p = provider(
            json!({"metadata": {"annotations": {OWNED_REFERENCES_ANNOTATION: "Pod a/b, Secret /x, Secret a/b/c, garbage, ConfigMap ns/ca"}}}),
        );
        assert_eq!(
            recorded(&p),
            [Owned {
                kind: OwnedKind::ConfigMap,
                namespace: "ns".into(),
                name: "ca".into()
            }]
            .into()
        );
    }

    #[test]
    fn the_owner_reference_names_the_provider_and_controls_nothing() {
        let r = owner_reference(&provider(json!({})));
        assert_eq!(
            (
                r.api_version.as_str(),
                r.kind.as_str(),
                r.name.as_str(),
                r.uid.as_str()
            ),
            ("banlieue.io/v1alpha1", "Provider", "pve", "u-1")
        );
        assert_eq!((r.controller, r.block_owner_deletion), (None, None));
    }
}
