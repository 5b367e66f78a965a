//! The seed image must read the same in the tools guests and operators use: `isoinfo` (Joliet and
//! plain ISO 9660 views) reads what we write, and we read what `genisoimage` writes.
//! Both tools come from Debian's `genisoimage` package, which `.ci/run` installs.

use std::collections::BTreeMap;
use std::process::Command;

use banlieue_cloudinit::{MetaData, NoCloudSeed, SeedFiles};

fn tool(name: &str) -> Command {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {name}"))
        .output()
        .unwrap();
    assert!(
        found.status.success(),
        "`{name}` is missing: apt-get install genisoimage (as .ci/run does)"
    );
    Command::new(name)
}

fn seed() -> NoCloudSeed {
    NoCloudSeed {
        user_data: b"#cloud-config\nhostname: worker-0\n".to_vec(),
        meta_data: MetaData {
            instance_id: "i-42".into(),
            local_hostname: "worker-0".into(),
        },
        network_config: None,
    }
}

fn isoinfo(image: &std::path::Path, args: &[&str]) -> String {
    let out = tool("isoinfo").arg("-i").arg(image).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "isoinfo {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn isoinfo_reads_our_image_by_joliet_and_iso9660_names() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seed.iso");
    std::fs::write(&path, seed().to_iso().unwrap()).unwrap();

    let descriptor = isoinfo(&path, &["-d"]);
    assert!(descriptor.contains("Volume id: cidata"), "{descriptor}");
    assert!(
        descriptor.contains("Joliet with UCS level 3 found"),
        "{descriptor}"
    );

    let joliet_listing = isoinfo(&path, &["-J", "-f"]);
    let mut names: Vec<&str> = joliet_listing.lines().collect();
    names.sort();
    assert_eq!(names, ["/meta-data", "/user-data"]);
    assert_eq!(
        isoinfo(&path, &["-J", "-x", "/user-data"]).as_bytes(),
        seed().user_data
    );
    assert_eq!(
        isoinfo(&path, &["-J", "-x", "/meta-data"]),
        "instance-id: i-42\nlocal-hostname: worker-0\n"
    );

    let plain_listing = isoinfo(&path, &["-f"]);
    assert!(plain_listing.contains("/USER_DATA.;1"), "{plain_listing}");
    assert_eq!(
        isoinfo(&path, &["-x", "/USER_DATA.;1"]).as_bytes(),
        seed().user_data
    );
}

#[test]
fn we_read_images_made_by_genisoimage() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = BTreeMap::new();
    expected.insert("user-data", "#cloud-config\npackages: [jq]\n");
    expected.insert(
        "meta-data",
        "instance-id: from-genisoimage\nlocal-hostname: cp-0\n",
    );
    expected.insert("network-config", "version: 2\nethernets: {}\n");
    for (name, content) in &expected {
        std::fs::write(dir.path().join(name), content).unwrap();
    }
    let image = dir.path().join("seed.iso");
    let out = tool("genisoimage")
        .args(["-quiet", "-output"])
        .arg(&image)
        .args(["-volid", "cidata", "-joliet", "-rock"])
        .args(expected.keys().map(|name| dir.path().join(name)))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "genisoimage: {}",
        String::from_utf8_lossy(&out.stderr)
    );

    let files = SeedFiles::from_iso(&std::fs::read(&image).unwrap()).unwrap();
    assert_eq!(files.user_data.as_deref(), Some(expected["user-data"].as_bytes()));
    assert_eq!(files.meta_data.as_deref(), Some(expected["meta-data"]));
    assert_eq!(files.network_config.as_deref(), Some(expected["network-config"]));
    assert_eq!(
        files.parsed_meta_data().unwrap().unwrap().instance_id,
        "from-genisoimage"
    );
}
