//! The subset of XML that vim25 SOAP responses use, parsed into a small element tree, and the
//! escaping used when writing requests.
//!
//! Supported: the XML declaration, comments, processing instructions, elements with attributes
//! (single or double quotes), text with the predefined and numeric character references, and
//! CDATA sections. A DOCTYPE is rejected (no entity expansion, so no "billion laughs").

use std::fmt::Write as _;

/// An element: qualified name, attributes, child elements and the concatenated text directly
/// inside it.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Element {
    /// Qualified name as written (`soapenv:Body`, `returnval`).
    pub name: String,
    /// Attributes as `(qualified name, unescaped value)`.
    pub attrs: Vec<(String, String)>,
    /// Child elements in document order.
    pub children: Vec<Element>,
    /// Text directly inside this element (unescaped).
    pub text: String,
}

/// The local part of a qualified name.
pub fn local(name: &str) -> &str {
    name.rsplit_once(':').map_or(name, |(_, l)| l)
}

impl Element {
    /// Local name (without the namespace prefix).
    pub fn local_name(&self) -> &str {
        local(&self.name)
    }

    /// The first child with this local name.
    pub fn child(&self, name: &str) -> Option<&Element> {
        self.children.iter().find(|c| c.local_name() == name)
    }

    /// Every child with this local name.
    pub fn children_named<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Element> + 'a {
        self.children.iter().filter(move |c| c.local_name() == name)
    }

    /// Text of the first child with this local name.
    pub fn child_text(&self, name: &str) -> Option<&str> {
        self.child(name).map(|c| c.text.as_str())
    }

    /// The descendant reached by following local names.
    pub fn path(&self, names: &[&str]) -> Option<&Element> {
        names.iter().try_fold(self, |el, n| el.child(n))
    }

    /// An attribute by exact qualified name (`type`), falling back to the local name.
    pub fn attr(&self, name: &str) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k == name)
            .or_else(|| {
                self.attrs
                    .iter()
                    .find(|(k, _)| local(k) == name && !k.starts_with("xmlns"))
            })
            .map(|(_, v)| v.as_str())
    }

    /// This element written back as XML under the name `tag` (its children under their local
    /// names): what a call returned passed on to another call as it is (e.g. an import spec).
    /// Namespace declarations are dropped; prefixed `type` and `nil` attributes are written
    /// `xsi:type`/`xsi:nil` (the prefix the request envelope declares), with an XML Schema type
    /// as `xsd:…`; other attributes unprefixed.
    pub fn to_xml(&self, tag: &str) -> String {
        let mut out = String::new();
        self.write_xml(tag, &mut out);
        out
    }

    fn write_xml(&self, tag: &str, out: &mut String) {
        out.push('<');
        out.push_str(tag);
        for (name, value) in &self.attrs {
            if name == "xmlns" || name.starts_with("xmlns:") {
                continue;
            }
            // xsi attributes keep their prefix (xsi:type, xsi:nil); a type of the XML Schema
            // namespace keeps its `xsd:` (declared by the envelope), a vim25 type is unprefixed.
            let prefixed = name.contains(':');
            let name = match local(name) {
                "type" if prefixed => "xsi:type".to_owned(),
                "nil" if prefixed => "xsi:nil".to_owned(),
                other => other.to_owned(),
            };
            let value = if name == "xsi:type" {
                match value.split_once(':') {
                    Some((prefix, ty)) if prefix == "xsd" || prefix == "xs" => format!("xsd:{ty}"),
                    _ => local(value).to_owned(),
                }
            } else {
                value.clone()
            };
            out.push_str(&format!(" {name}=\"{}\"", escape(&value)));
        }
        out.push('>');
        out.push_str(&escape(&self.text));
        for child in &self.children {
            child.write_xml(child.local_name(), out);
        }
        out.push_str("</");
        out.push_str(tag);
        out.push('>');
    }

    /// The `xsi:type` attribute (without prefix), if any.
    pub fn xsi_type(&self) -> Option<&str> {
        self.attrs
            .iter()
            .find(|(k, _)| k.contains(':') && local(k) == "type")
            .map(|(_, v)| local(v))
    }
}

/// Why a document could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed XML at byte {offset}: {message}")]
pub struct XmlError {
    /// Byte offset of the problem.
    pub offset: usize,
    /// What was wrong.
    pub message: String,
}

fn err(offset: usize, message: impl Into<String>) -> XmlError {
    XmlError {
        offset,
        message: message.into(),
    }
}

/// Parses a document and returns its root element.
pub fn parse(doc: &str) -> Result<Element, XmlError> {
    let b = doc.as_bytes();
    let mut i = 0;
    let mut stack: Vec<Element> = Vec::new();
    let mut root: Option<Element> = None;
    while i < b.len() {
        if b[i] == b'<' {
            if doc[i..].starts_with("<?") {
                i = find(doc, i, "?>")? + 2;
            } else if doc[i..].starts_with("<!--") {
                i = find(doc, i, "-->")? + 3;
            } else if doc[i..].starts_with("<![CDATA[") {
                let end = find(doc, i, "]]>")?;
                let top = stack
                    .last_mut()
                    .ok_or_else(|| err(i, "CDATA outside the root element"))?;
                top.text.push_str(&doc[i + 9..end]);
                i = end + 3;
            } else if doc[i..].starts_with("<!") {
                return Err(err(i, "DOCTYPE and declarations are not accepted"));
            } else if doc[i..].starts_with("</") {
                let end = find(doc, i, ">")?;
                let name = doc[i + 2..end].trim();
                let el = stack
                    .pop()
                    .ok_or_else(|| err(i, format!("unexpected </{name}>")))?;
                if el.name != name {
                    return Err(err(i, format!("</{name}> closes <{}>", el.name)));
                }
                i = end + 1;
                close(el, &mut stack, &mut root, i)?;
            } else {
                let (el, empty, next) = start_tag(doc, i)?;
                i = next;
                if empty {
                    close(el, &mut stack, &mut root, i)?;
                } else {
                    stack.push(el);
                }
            }
        } else {
            let end = doc[i..].find('<').map_or(b.len(), |p| i + p);
            let raw = &doc[i..end];
            match stack.last_mut() {
                Some(top) => top.text.push_str(&unescape(raw, i)?),
                None if raw.trim().is_empty() => {}
                None => return Err(err(i, "text outside the root element")),
            }
            i = end;
        }
    }
    if let Some(open) = stack.last() {
        return Err(err(b.len(), format!("<{}> is not closed", open.name)));
    }
    root.ok_or_else(|| err(0, "no root element"))
}

fn find(doc: &str, from: usize, what: &str) -> Result<usize, XmlError> {
    doc[from..]
        .find(what)
        .map(|p| from + p)
        .ok_or_else(|| err(from, format!("missing {what:?}")))
}

fn close(el: Element, stack: &mut [Element], root: &mut Option<Element>, at: usize) -> Result<(), XmlError> {
    match stack.last_mut() {
        Some(parent) => parent.children.push(el),
        None if root.is_none() => *root = Some(el),
        None => return Err(err(at, "more than one root element")),
    }
    Ok(())
}

fn start_tag(doc: &str, start: usize) -> Result<(Element, bool, usize), XmlError> {
    let b = doc.as_bytes();
    let mut i = start + 1;
    let name_end = doc[i..]
        .find(|c: char| c.is_whitespace() || c == '>' || c == '/')
        .map(|p| i + p)
        .ok_or_else(|| err(start, "unterminated tag"))?;
    let name = &doc[i..name_end];
    if name.is_empty() {
        return Err(err(start, "empty tag name"));
    }
    let mut el = Element {
        name: name.to_owned(),
        ..Element::default()
    };
    i = name_end;
    loop {
        while i < b.len() && b[i].is_ascii_whitespace() {
            i += 1;
        }
        match b.get(i) {
            None => return Err(err(start, "unterminated tag")),
            Some(b'>') => return Ok((el, false, i + 1)),
            Some(b'/') if b.get(i + 1) == Some(&b'>') => return Ok((el, true, i + 2)),
            Some(_) => {
                let eq = find(doc, i, "=")?;
                let key = doc[i..eq].trim();
                let mut q = eq + 1;
                while q < b.len() && b[q].is_ascii_whitespace() {
                    q += 1;
                }
                let quote = match b.get(q) {
                    Some(c @ (b'"' | b'\'')) => *c as char,
                    _ => return Err(err(q, "attribute value must be quoted")),
                };
                let vend = doc[q + 1..]
                    .find(quote)
                    .map(|p| q + 1 + p)
                    .ok_or_else(|| err(q, "unterminated attribute value"))?;
                el.attrs
                    .push((key.to_owned(), unescape(&doc[q + 1..vend], q + 1)?.into_owned()));
                i = vend + 1;
            }
        }
    }
}

/// Resolves the predefined entities and numeric character references.
pub fn unescape(raw: &str, offset: usize) -> Result<std::borrow::Cow<'_, str>, XmlError> {
    if !raw.contains('&') {
        return Ok(raw.into());
    }
    let mut out = String::with_capacity(raw.len());
    let mut rest = raw;
    while let Some(amp) = rest.find('&') {
        out.push_str(&rest[..amp]);
        let semi = rest[amp..]
            .find(';')
            .map(|p| amp + p)
            .ok_or_else(|| err(offset, "unterminated character reference"))?;
        let entity = &rest[amp + 1..semi];
        let ch = match entity {
            "lt" => '<',
            "gt" => '>',
            "amp" => '&',
            "quot" => '"',
            "apos" => '\'',
            _ => {
                let code = if let Some(hex) = entity.strip_prefix("#x") {
                    u32::from_str_radix(hex, 16).ok()
                } else if let Some(dec) = entity.strip_prefix('#') {
                    dec.parse().ok()
                } else {
                    None
                };
                code.and_then(char::from_u32)
                    .ok_or_else(|| err(offset, format!("unknown reference &{entity};")))?
            }
        };
        out.push(ch);
        rest = &rest[semi + 1..];
    }
    out.push_str(rest);
    Ok(out.into())
}

/// Escapes text or an attribute value.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&apos;"),
            c if (c as u32) < 0x20 && !matches!(c, '\n' | '\r' | '\t') => {
                let _ = write!(out, "&#{};", c as u32);
            }
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_a_soap_response() {
        let doc = r#"<?xml version="1.0" encoding="UTF-8"?>
<soapenv:Envelope xmlns:soapenv="http://schemas.xmlsoap.org/soap/envelope/" xmlns:xsi="x">
 <soapenv:Body><FindByInventoryPathResponse xmlns="urn:vim25">
  <returnval type="VirtualMachine">vm-42</returnval>
  <!-- a comment -->
  <val xsi:type="xsd:string">a &lt;b&gt; &amp; &#233;&#x41;</val><empty a='1' />
  <c><![CDATA[<raw>]]></c>
 </FindByInventoryPathResponse></soapenv:Body></soapenv:Envelope>"#;
        let root = parse(doc).unwrap();
        assert_eq!(root.local_name(), "Envelope");
        let resp = root.path(&["Body", "FindByInventoryPathResponse"]).unwrap();
        let rv = resp.child("returnval").unwrap();
        assert_eq!(rv.attr("type"), Some("VirtualMachine"));
        assert_eq!(rv.xsi_type(), None);
        assert_eq!(rv.text, "vm-42");
        let val = resp.child("val").unwrap();
        assert_eq!(val.text, "a <b> & éA");
        assert_eq!(val.xsi_type(), Some("string"));
        assert_eq!(resp.child("empty").unwrap().attr("a"), Some("1"));
        assert_eq!(resp.child_text("c"), Some("<raw>"));
    }

    #[test]
    fn rejects_malformed_documents() {
        for bad in [
            "<a><b></a>",
            "<a>",
            "<a></a><b></b>",
            "text",
            "<a x=1></a>",
            "<!DOCTYPE a [<!ENTITY x \"y\">]><a>&x;</a>",
            "<a>&unknown;</a>",
            "",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} was accepted");
        }
    }

    #[test]
    fn escape_round_trips() {
        let text = "<x a=\"1\"> & 'q' \u{1}";
        let doc = format!("<v>{}</v>", escape(text));
        assert_eq!(parse(&doc).unwrap().text, text);
    }
}

#[cfg(test)]
mod to_xml_tests {
    use super::*;

    #[test]
    fn schema_types_and_nil_keep_their_namespaces() {
        let doc = parse(
            r#"<importSpec xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" xmlns:xsd="http://www.w3.org/2001/XMLSchema" xsi:type="VirtualMachineImportSpec"><extraConfig><key>a</key><value xsi:type="xsd:string">1 &amp; 2</value></extraConfig><none xsi:nil="true"/></importSpec>"#,
        )
        .unwrap();
        assert_eq!(
            doc.to_xml("spec"),
            r#"<spec xsi:type="VirtualMachineImportSpec"><extraConfig><key>a</key><value xsi:type="xsd:string">1 &amp; 2</value></extraConfig><none xsi:nil="true"></none></spec>"#
        );
    }
}
