//! Managed object references and the parts of `ServiceContent` the client uses: plain data
//! every other module reads (the calls that use them are in [`crate::vim`]).

use crate::xml::{self, Element};

/// A managed object reference: type and id (`VirtualMachine`, `vm-42`).
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoRef {
    /// Managed object type, e.g. `VirtualMachine`, `Task`, `Folder`.
    pub kind: String,
    /// Id, e.g. `vm-42`.
    pub value: String,
}

impl MoRef {
    /// A reference of type `kind` to `value`.
    pub fn new(kind: impl Into<String>, value: impl Into<String>) -> Self {
        Self {
            kind: kind.into(),
            value: value.into(),
        }
    }

    /// `<tag type="kind">value</tag>`.
    pub fn to_xml(&self, tag: &str) -> String {
        format!(
            "<{tag} type=\"{}\">{}</{tag}>",
            xml::escape(&self.kind),
            xml::escape(&self.value)
        )
    }

    /// Reads `<x type="kind">value</x>`.
    pub fn from_xml(el: &Element) -> Option<Self> {
        let kind = el.attr("type")?;
        let value = el.text.trim();
        (!value.is_empty()).then(|| Self::new(kind, value))
    }
}

impl std::fmt::Display for MoRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.kind, self.value)
    }
}

/// The parts of `ServiceContent` the client uses.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceContent {
    /// Inventory root.
    pub root_folder: MoRef,
    /// The PropertyCollector.
    pub property_collector: MoRef,
    /// The ViewManager.
    pub view_manager: MoRef,
    /// The SearchIndex.
    pub search_index: MoRef,
    /// The SessionManager.
    pub session_manager: MoRef,
    /// The OvfManager (`None` where the endpoint has none).
    pub ovf_manager: Option<MoRef>,
    /// `about.apiVersion`, e.g. `8.0.2.0`.
    pub api_version: String,
    /// `about.fullName`.
    pub full_name: String,
    /// `about.apiType`: `VirtualCenter` or `HostAgent`.
    pub api_type: String,
}

impl ServiceContent {
    pub(crate) fn from_xml(rv: &Element) -> std::result::Result<Self, String> {
        let mo = |name: &str| {
            rv.child(name)
                .and_then(MoRef::from_xml)
                .ok_or_else(|| format!("ServiceContent has no {name}"))
        };
        let about = |name: &str| {
            rv.path(&["about", name])
                .map(|e| e.text.clone())
                .unwrap_or_default()
        };
        Ok(Self {
            root_folder: mo("rootFolder")?,
            property_collector: mo("propertyCollector")?,
            view_manager: mo("viewManager")?,
            search_index: mo("searchIndex")?,
            session_manager: mo("sessionManager")?,
            ovf_manager: rv.child("ovfManager").and_then(MoRef::from_xml),
            api_version: about("apiVersion"),
            full_name: about("fullName"),
            api_type: about("apiType"),
        })
    }
}
