//! The images built here for real nodes (`banlieue_dev::images`) agree with the `Dockerfile`,
//! the recipe of the published images, on entrypoint, user, exposed ports and the binary's path,
//! and carry the names and tags the clusterctl components reference by default.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use anyhow::{Context as _, Result, ensure};
use banlieue_testenv::images::ImageConfig;

fn root() -> &'static Path {
    Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))
}

/// What a Dockerfile stage declares.
#[derive(Debug, Default)]
struct Stage {
    entrypoint: Vec<String>,
    user: String,
    exposed_ports: BTreeSet<String>,
    copied_to: BTreeSet<String>,
}

/// The final stages (`FROM … AS name`) of the Dockerfile and what each declares.
fn dockerfile_stages(text: &str) -> Result<BTreeMap<String, Stage>> {
    let mut stages = BTreeMap::new();
    let mut current: Option<(String, Stage)> = None;
    for line in text.lines().map(str::trim) {
        let (instruction, rest) = line.split_once(' ').unwrap_or((line, ""));
        match instruction {
            "FROM" => {
                if let Some((name, stage)) = current.take() {
                    stages.insert(name, stage);
                }
                let name = rest.rsplit_once(" AS ").map(|(_, n)| n.trim().to_owned());
                current = name.map(|n| (n, Stage::default()));
            }
            "ENTRYPOINT" => {
                if let Some((_, stage)) = &mut current {
                    stage.entrypoint = serde_json::from_str(rest).context("ENTRYPOINT is not exec form")?;
                }
            }
            "USER" => {
                if let Some((_, stage)) = &mut current {
                    stage.user = rest.to_owned();
                }
            }
            "EXPOSE" => {
                if let Some((_, stage)) = &mut current {
                    stage.exposed_ports = rest.split_whitespace().map(|p| format!("{p}/tcp")).collect();
                }
            }
            "COPY" => {
                if let (Some((_, stage)), Some(destination)) = (&mut current, rest.split_whitespace().last())
                {
                    stage.copied_to.insert(destination.to_owned());
                }
            }
            _ => {}
        }
    }
    if let Some((name, stage)) = current {
        stages.insert(name, stage);
    }
    Ok(stages)
}

#[test]
fn locally_built_images_match_the_dockerfile_and_the_components() -> Result<()> {
    let dockerfile = std::fs::read_to_string(root().join("Dockerfile"))?;
    let stages = dockerfile_stages(&dockerfile)?;
    let bin_dir = banlieue_dev::binary_dir()?;
    let out = tempfile::tempdir()?;
    for image in banlieue_dev::images::ALL {
        let stage = stages
            .get(image.dockerfile_target)
            .with_context(|| format!("no stage {} in the Dockerfile", image.dockerfile_target))?;
        let tarball = image.build(&bin_dir, out.path())?;
        let built = ImageConfig::read(&tarball)?;
        let name = image.dockerfile_target;
        ensure!(
            built.entrypoint == stage.entrypoint,
            "{name}: entrypoint {:?} here, {:?} in the Dockerfile",
            built.entrypoint,
            stage.entrypoint
        );
        ensure!(
            built.user == stage.user,
            "{name}: user {:?} here, {:?} in the Dockerfile",
            built.user,
            stage.user
        );
        ensure!(
            built.exposed_ports == stage.exposed_ports,
            "{name}: ports {:?} here, {:?} in the Dockerfile",
            built.exposed_ports,
            stage.exposed_ports
        );
        for file in &stage.copied_to {
            ensure!(
                built.files.contains(file),
                "{name}: the Dockerfile copies {file}, the image built here has no such file"
            );
        }
    }
    // The components reference these names and tags (by default: `${BANLIEUE_<X>_IMAGE:=…}`; the
    // core manifest, applied with kubectl, plainly).
    let mut referenced = String::new();
    for entry in std::fs::read_dir(root().join("clusterctl/dist"))? {
        let path = entry?.path();
        let files: Vec<_> = if path.is_dir() {
            std::fs::read_dir(&path)?.flatten().map(|e| e.path()).collect()
        } else {
            vec![path]
        };
        for file in files
            .iter()
            .filter(|f| f.extension().is_some_and(|e| e == "yaml"))
        {
            referenced.push_str(&std::fs::read_to_string(file)?);
        }
    }
    for image in banlieue_dev::images::ALL {
        ensure!(
            referenced.contains(&format!(":={}}}", image.reference))
                || referenced.contains(&format!("image: {}\n", image.reference)),
            "no component references {} by default",
            image.reference
        );
    }
    Ok(())
}

#[test]
fn the_dockerfile_parser_reads_a_stage() -> Result<()> {
    let stages = dockerfile_stages(
        "FROM a AS build\nRUN x\nFROM b AS app\nCOPY --from=build /out/app /app\nUSER 1:1\nEXPOSE 80 81\nENTRYPOINT [\"/app\"]\n",
    )?;
    let app = &stages["app"];
    assert_eq!(app.entrypoint, ["/app"]);
    assert_eq!(app.user, "1:1");
    assert_eq!(
        app.exposed_ports,
        BTreeSet::from(["80/tcp".to_owned(), "81/tcp".to_owned()])
    );
    assert!(app.copied_to.contains("/app"));
    Ok(())
}
