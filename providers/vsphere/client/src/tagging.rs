//! vSphere tags (the vAPI REST tagging service, `/rest/com/vmware/cis/tagging`): categories,
//! tags in them, and the tags attached to a VM.

use http::Method;
use serde_json::{Value, json};

use crate::Client;
use crate::error::{Error, Result};
use crate::objects::MoRef;

/// A tag: its id, name and category id.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tag {
    /// `urn:vmomi:InventoryServiceTag:…`.
    pub id: String,
    /// Its name.
    pub name: String,
    /// The category it belongs to.
    pub category_id: String,
}

fn ids(value: Option<Value>) -> Vec<String> {
    value
        .and_then(|v| v.as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

fn text(value: &Value, key: &str) -> String {
    value
        .get(key)
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_owned()
}

fn object(vm: &MoRef) -> Value {
    json!({"object_id": {"id": vm.value, "type": vm.kind}})
}

impl Client {
    /// The id of the category `name`, if there is one.
    pub async fn find_category(&self, name: &str) -> Result<Option<String>> {
        for id in ids(self
            .rest(Method::GET, "/com/vmware/cis/tagging/category", None)
            .await?)
        {
            let category = self
                .rest(
                    Method::GET,
                    &format!("/com/vmware/cis/tagging/category/id:{id}"),
                    None,
                )
                .await?
                .unwrap_or_default();
            if text(&category, "name") == name {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// The id of the category `name`, created (one tag per object, for VMs) when missing.
    pub async fn ensure_category(&self, name: &str, description: &str) -> Result<String> {
        if let Some(id) = self.find_category(name).await? {
            return Ok(id);
        }
        let spec = json!({"create_spec": {
            "name": name, "description": description, "cardinality": "SINGLE",
            "associable_types": ["VirtualMachine"],
        }});
        self.rest(Method::POST, "/com/vmware/cis/tagging/category", Some(&spec))
            .await?
            .and_then(|v| v.as_str().map(str::to_owned))
            .ok_or_else(|| Error::Decode {
                method: "creating a tag category".into(),
                message: "no id in the answer".into(),
            })
    }

    /// The id of the tag `name` in `category_id`, created when missing.
    pub async fn ensure_tag(&self, category_id: &str, name: &str, description: &str) -> Result<String> {
        let listed = self
            .rest(
                Method::POST,
                &format!("/com/vmware/cis/tagging/tag/id:{category_id}?~action=list-tags-for-category"),
                None,
            )
            .await?;
        for id in ids(listed) {
            if self.tag(&id).await?.is_some_and(|t| t.name == name) {
                return Ok(id);
            }
        }
        let spec =
            json!({"create_spec": {"name": name, "description": description, "category_id": category_id}});
        self.rest(Method::POST, "/com/vmware/cis/tagging/tag", Some(&spec))
            .await?
            .and_then(|v| v.as_str().map(str::to_owned))
            .ok_or_else(|| Error::Decode {
                method: "creating a tag".into(),
                message: "no id in the answer".into(),
            })
    }

    /// A tag by id (`None` when it is gone).
    pub async fn tag(&self, id: &str) -> Result<Option<Tag>> {
        match self
            .rest(Method::GET, &format!("/com/vmware/cis/tagging/tag/id:{id}"), None)
            .await
        {
            Ok(Some(tag)) => Ok(Some(Tag {
                id: id.to_owned(),
                name: text(&tag, "name"),
                category_id: text(&tag, "category_id"),
            })),
            Ok(None) => Ok(None),
            Err(Error::Http { status: 404, .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The ids of the tags attached to `vm`.
    pub async fn attached_tags(&self, vm: &MoRef) -> Result<Vec<String>> {
        Ok(ids(self
            .rest(
                Method::POST,
                "/com/vmware/cis/tagging/tag-association?~action=list-attached-tags",
                Some(&object(vm)),
            )
            .await?))
    }

    /// Attaches tag `id` to `vm`.
    pub async fn attach_tag(&self, id: &str, vm: &MoRef) -> Result<()> {
        self.rest(
            Method::POST,
            &format!("/com/vmware/cis/tagging/tag-association/id:{id}?~action=attach"),
            Some(&object(vm)),
        )
        .await
        .map(|_| ())
    }

    /// Detaches tag `id` from `vm`.
    pub async fn detach_tag(&self, id: &str, vm: &MoRef) -> Result<()> {
        self.rest(
            Method::POST,
            &format!("/com/vmware/cis/tagging/tag-association/id:{id}?~action=detach"),
            Some(&object(vm)),
        )
        .await
        .map(|_| ())
    }
}
