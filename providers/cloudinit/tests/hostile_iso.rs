//! A seed image read back (simulators, tests, the conformance checks read what a provider
//! uploaded): a damaged or hostile image is an error, never a panic or a runaway read.

#[path = "../../../tests/hostile/support.rs"]
mod hostile;

use banlieue_cloudinit::{MetaData, NoCloudSeed, SeedFiles};
use hostile::Hostile;

#[test]
fn damaged_seed_images_never_panic_the_reader() {
    let image = NoCloudSeed {
        user_data: b"#cloud-config\nruncmd: [true]\n".to_vec(),
        meta_data: MetaData {
            instance_id: "i-1".into(),
            local_hostname: "worker-0".into(),
        },
        network_config: None,
    }
    .to_iso()
    .expect("a seed image");
    assert!(SeedFiles::from_iso(&image).is_ok());
    let mut h = Hostile::new(31);
    for _ in 0..Hostile::cases() {
        let _ = SeedFiles::from_iso(&h.mutate_bytes(&image));
    }
}
