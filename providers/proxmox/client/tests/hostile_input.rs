//! Hostile and broken input for what the client decodes from Proxmox VE (task ids, property
//! strings of NICs, disks and IP configs, sizes, tags, fingerprints): never a panic, and what
//! parses prints back to a text that parses to the same value.

#[path = "../../../../tests/hostile/support.rs"]
mod hostile;

use std::fmt::Display;
use std::str::FromStr;

use banlieue_pve_client::config::{normalize_tags, split_property_string};
use banlieue_pve_client::{DiskSpec, IpConfig, NetDevice, Size, Upid, parse_fingerprint};
use hostile::Hostile;

/// Every case of `samples` mutated (and random text): no panic, and a value that parses is
/// printed as a text that parses back to it.
fn round_trips<T>(seed: u64, samples: &[&str])
where
    T: FromStr + Display + PartialEq + std::fmt::Debug,
    T::Err: std::fmt::Debug,
{
    let mut h = Hostile::new(seed);
    for _ in 0..Hostile::cases() {
        let input = h.input(samples);
        if let Ok(value) = input.parse::<T>() {
            let printed = value.to_string();
            let again = printed.parse::<T>();
            assert!(
                again.as_ref().is_ok_and(|v| *v == value),
                "{input:?} parsed as {value:?}, printed as {printed:?}, which parses as {again:?}"
            );
        }
    }
}

#[test]
fn task_ids() {
    round_trips::<Upid>(
        1,
        &[
            "UPID:pve1:0000ABCD:00A1B2C3:65F0A1B2:qmclone:101:root@pam!banlieue:",
            "UPID:n:1:2:3:x::u:",
        ],
    );
}

#[test]
fn nic_property_strings() {
    round_trips::<NetDevice>(
        2,
        &[
            "virtio=BC:24:11:00:90:00,bridge=vmbr0,firewall=1,tag=20,mtu=1450,queues=4",
            "e1000,bridge=vmbr1",
        ],
    );
}

#[test]
fn disk_property_strings() {
    round_trips::<DiskSpec>(
        3,
        &[
            "local-lvm:vm-101-disk-0,size=32G,discard=on,ssd=1",
            "local:iso/seed.iso,media=cdrom",
            "none,media=cdrom",
        ],
    );
}

#[test]
fn ip_config_property_strings() {
    round_trips::<IpConfig>(
        4,
        &[
            "ip=10.0.0.5/24,gw=10.0.0.1,ip6=fd00::5/64,gw6=fd00::1",
            "ip=dhcp,ip6=auto",
        ],
    );
}

#[test]
fn sizes() {
    round_trips::<Size>(5, &["32G", "512M", "1T", "4096K", "0"]);
}

#[test]
fn tags_fingerprints_and_property_lists_never_panic() {
    let mut h = Hostile::new(6);
    for _ in 0..Hostile::cases() {
        let _ = normalize_tags(&h.input(&["k8s;banlieue-uid-4f1c2d3e;Team_A", "a,b c"]));
        let _ = parse_fingerprint(&h.input(&[
            "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89",
        ]));
        let _ = split_property_string(&h.input(&["a=1,b=2,c", "=,=,"]));
    }
}
