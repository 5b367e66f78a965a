//! vSphere tags from labels (`spec.tagsFromLabels`): each listed label key is a tag category of
//! its own (one tag per VM), the label's value the tag (the key's name part for a label without
//! a value). A VM's tags in those categories are brought to the labels: a changed value moves
//! the VM to the other tag, a removed label detaches it; tags of other categories stay.
//!
//! Tags and categories never change their name or category, so what was read of them is kept
//! for the process (by server and id): a reconcile with nothing to change makes one call, the
//! list of the VM's tags.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

use banlieue_provider_kit::lock;
use banlieue_vsphere_client::tagging::Tag;
use banlieue_vsphere_client::{Client, MoRef};

/// Condition reason (`VMUpToDate`) and Warning: the VM's tags could not be set.
pub const TAGGING_FAILED: &str = "TaggingFailed";
/// Event reason: tags attached or detached.
pub const TAGS_CHANGED: &str = "TagsChanged";

/// Description of the categories and tags the provider creates.
const DESCRIPTION: &str = "created by banlieue from a machine label (spec.tagsFromLabels)";

/// What was read of tags (by server, tag id) and categories (by server, name → id).
#[derive(Default)]
struct Known {
    tags: HashMap<(String, String), Tag>,
    categories: HashMap<(String, String), String>,
}

static KNOWN: LazyLock<Mutex<Known>> = LazyLock::new(Mutex::default);

fn known() -> std::sync::MutexGuard<'static, Known> {
    lock(&KNOWN)
}

/// The tag each listed key asks for: category (the key) → tag name (the value, or the key's
/// name part for an empty value); `None` for a key the labels do not carry.
pub fn wanted(labels: &BTreeMap<String, String>, keys: &[String]) -> BTreeMap<String, Option<String>> {
    keys.iter()
        .map(|key| {
            let tag = labels.get(key).map(|value| {
                if value.is_empty() {
                    key.rsplit('/').next().unwrap_or(key).to_owned()
                } else {
                    value.clone()
                }
            });
            (key.clone(), tag)
        })
        .collect()
}

async fn tag_of(c: &Client, id: &str) -> banlieue_vsphere_client::Result<Option<Tag>> {
    let key = (c.endpoint(), id.to_owned());
    if let Some(tag) = known().tags.get(&key) {
        return Ok(Some(tag.clone()));
    }
    let tag = c.tag(id).await?;
    if let Some(tag) = &tag {
        known().tags.insert(key, tag.clone());
    }
    Ok(tag)
}

/// The id of category `name`: created when missing with `create`, else `None` when missing.
async fn category_id(
    c: &Client,
    name: &str,
    create: bool,
) -> banlieue_vsphere_client::Result<Option<String>> {
    let key = (c.endpoint(), name.to_owned());
    if let Some(id) = known().categories.get(&key) {
        return Ok(Some(id.clone()));
    }
    let id = if create {
        Some(c.ensure_category(name, DESCRIPTION).await?)
    } else {
        c.find_category(name).await?
    };
    if let Some(id) = &id {
        known().categories.insert(key, id.clone());
    }
    Ok(id)
}

/// Brings `vm`'s tags in the categories of `wanted` to it; what changed, for an Event.
pub async fn sync(
    c: &Client,
    vm: &MoRef,
    wanted: &BTreeMap<String, Option<String>>,
) -> banlieue_vsphere_client::Result<Vec<String>> {
    if wanted.is_empty() {
        return Ok(Vec::new());
    }
    let mut attached = Vec::new();
    for id in c.attached_tags(vm).await? {
        if let Some(tag) = tag_of(c, &id).await? {
            attached.push(tag);
        }
    }
    let mut changes = Vec::new();
    for (category, want) in wanted {
        // The category is created only to attach a tag; a VM without tags has none to detach.
        if want.is_none() && attached.is_empty() {
            continue;
        }
        let Some(category_id) = category_id(c, category, want.is_some()).await? else {
            continue;
        };
        let mine: Vec<&Tag> = attached.iter().filter(|t| t.category_id == category_id).collect();
        if let Some(name) = want
            && mine.iter().any(|t| &t.name == name)
            && mine.len() == 1
        {
            continue;
        }
        for tag in &mine {
            c.detach_tag(&tag.id, vm).await?;
            changes.push(format!("detached {category}={}", tag.name));
        }
        if let Some(name) = want {
            let tag_id = c.ensure_tag(&category_id, name, DESCRIPTION).await?;
            c.attach_tag(&tag_id, vm).await?;
            changes.push(format!("attached {category}={name}"));
        }
    }
    Ok(changes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_listed_key_asks_for_its_value_or_its_name() {
        let labels: BTreeMap<String, String> = [
            ("cluster.x-k8s.io/cluster-name", "prod"),
            ("node-role.kubernetes.io/control-plane", ""),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        let keys = [
            "cluster.x-k8s.io/cluster-name".to_owned(),
            "node-role.kubernetes.io/control-plane".to_owned(),
            "team".to_owned(),
        ];
        let wanted = wanted(&labels, &keys);
        assert_eq!(wanted["cluster.x-k8s.io/cluster-name"].as_deref(), Some("prod"));
        assert_eq!(
            wanted["node-role.kubernetes.io/control-plane"].as_deref(),
            Some("control-plane")
        );
        assert_eq!(wanted["team"], None);
    }
}
