//! The command-line flags every provider takes (flattened into each binary's own `clap` flags;
//! names as controller-runtime managers spell them). Each is also settable through the named
//! environment variable where one is given.

use std::net::SocketAddr;

use crate::leader::default_identity;
use crate::logging::LogFormat;
use crate::manager::{LeaseSettings, ManagerConfig};

/// Flags shared by the providers.
#[derive(clap::Args, Clone, Debug)]
pub struct RuntimeArgs {
    /// Only watch this namespace (default: all namespaces).
    #[arg(long, env = "WATCH_NAMESPACE")]
    pub namespace: Option<String>,
    /// Concurrent reconciles per controller.
    #[arg(long, env = "CONCURRENCY", default_value_t = 10)]
    pub concurrency: u16,
    /// Address of the Prometheus `/metrics` endpoint.
    #[arg(long, default_value = "0.0.0.0:8080")]
    pub metrics_bind_address: SocketAddr,
    /// Address of the `/healthz` and `/readyz` endpoints.
    #[arg(long, default_value = "0.0.0.0:8081")]
    pub health_probe_bind_address: SocketAddr,
    /// Only reconcile objects labelled `cluster.x-k8s.io/watch-filter=<value>` (CAPI's flag):
    /// replicas started with different values split the work, each electing its own leader.
    #[arg(long, env = "WATCH_FILTER", value_parser = label_value)]
    pub watch_filter: Option<String>,
    /// Elect a leader through a Lease before running the controllers.
    #[arg(long, env = "LEADER_ELECT")]
    pub leader_elect: bool,
    /// Name of the leader election Lease (default: `<binary>-leader`, or
    /// `<binary>-<watch filter>-leader` with a watch filter: one leader per shard).
    #[arg(long)]
    pub leader_election_id: Option<String>,
    /// Namespace of the leader election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    pub leader_election_namespace: String,
    /// Log format.
    #[arg(long, value_enum, default_value = "json")]
    pub log_format: LogFormat,
}

impl RuntimeArgs {
    /// `<component>-leader`, with the watch filter of this replica's shard before `-leader`
    /// when given (lower case, `_` and `.` as `-`: a Lease name). Not the namespace: replicas
    /// sharded by namespace name their Lease (`--leader-election-id`), and a Lease name that
    /// changed with an upgrade would let the old and the new replica both lead.
    fn default_lease_name(&self, component: &str) -> String {
        let mut name = component.to_owned();
        if let Some(part) = &self.watch_filter {
            name.push('-');
            name.extend(part.chars().map(|c| {
                if c == '_' || c == '.' {
                    '-'
                } else {
                    c.to_ascii_lowercase()
                }
            }));
        }
        name.push_str("-leader");
        name
    }

    /// The manager settings of binary `component` (e.g. `banlieue-libvirt`); the Lease is
    /// `--leader-election-id`, else `<component>-leader`.
    pub fn manager(&self, component: &str) -> ManagerConfig {
        ManagerConfig {
            metrics_addr: self.metrics_bind_address,
            health_addr: Some(self.health_probe_bind_address).filter(|a| *a != self.metrics_bind_address),
            leader: self.leader_elect.then(|| LeaseSettings {
                name: self
                    .leader_election_id
                    .clone()
                    .unwrap_or_else(|| self.default_lease_name(component)),
                namespace: self.leader_election_namespace.clone(),
                identity: default_identity(component),
            }),
        }
    }
}

/// A Kubernetes label value: at most 63 characters, alphanumerics with `-`, `_` and `.`
/// inside.
fn label_value(value: &str) -> Result<String, String> {
    let inner_ok = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    let ends_ok = value.starts_with(|c: char| c.is_ascii_alphanumeric())
        && value.ends_with(|c: char| c.is_ascii_alphanumeric());
    if value.len() <= 63 && inner_ok && ends_ok {
        Ok(value.to_owned())
    } else {
        Err(format!(
            "{value:?} is not a label value (at most 63 characters, letters and digits, with - _ . inside)"
        ))
    }
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    #[derive(Parser, Debug)]
    struct Cli {
        #[command(flatten)]
        runtime: RuntimeArgs,
    }

    #[test]
    fn defaults_are_json_logs_without_leader_election() {
        Cli::command().debug_assert();
        let cli = Cli::try_parse_from(["x"]).expect("parses");
        let r = cli.runtime;
        assert!(!r.leader_elect);
        assert_eq!(r.log_format, LogFormat::Json);
        assert_eq!(r.concurrency, 10);
        let m = r.manager("banlieue-x");
        assert!(m.leader.is_none());
        assert_eq!(m.metrics_addr.port(), 8080);
        assert_eq!(m.health_addr.map(|a| a.port()), Some(8081));
    }

    #[test]
    fn leader_election_names_the_lease_after_the_binary_unless_given() {
        let cli = Cli::try_parse_from(["x", "--leader-elect", "--leader-election-namespace", "ops"])
            .expect("parses");
        let lease = cli.runtime.manager("banlieue-x").leader.expect("elects");
        assert_eq!(
            (lease.name.as_str(), lease.namespace.as_str()),
            ("banlieue-x-leader", "ops")
        );
        let cli =
            Cli::try_parse_from(["x", "--leader-elect", "--leader-election-id", "mine"]).expect("parses");
        assert_eq!(
            cli.runtime.manager("banlieue-x").leader.expect("elects").name,
            "mine"
        );
    }

    #[test]
    fn each_shard_elects_its_own_leader_and_a_bad_watch_filter_is_refused() {
        let cli = Cli::try_parse_from(["x", "--leader-elect", "--watch-filter", "Team_A.1"]).expect("parses");
        assert_eq!(cli.runtime.watch_filter.as_deref(), Some("Team_A.1"));
        let lease = cli.runtime.manager("banlieue-x").leader.expect("elects");
        assert_eq!(lease.name, "banlieue-x-team-a-1-leader");
        let cli = Cli::try_parse_from(["x", "--leader-elect", "--namespace", "ops", "--watch-filter", "b"])
            .expect("parses");
        let lease = cli.runtime.manager("banlieue-x").leader.expect("elects");
        assert_eq!(lease.name, "banlieue-x-b-leader");
        for bad in ["a-", "a b", "", &"x".repeat(64)] {
            let arg = format!("--watch-filter={bad}");
            let err = Cli::try_parse_from(["x", arg.as_str()]).expect_err(bad);
            assert!(err.to_string().contains("is not a label value"), "{err}");
        }
    }

    #[test]
    fn one_address_for_both_endpoints_serves_once_and_bad_values_are_rejected() {
        let cli = Cli::try_parse_from([
            "x",
            "--metrics-bind-address",
            "127.0.0.1:9000",
            "--health-probe-bind-address",
            "127.0.0.1:9000",
            "--log-format",
            "text",
            "--namespace",
            "capi",
        ])
        .expect("parses");
        assert_eq!(cli.runtime.namespace.as_deref(), Some("capi"));
        assert_eq!(cli.runtime.manager("x").health_addr, None);
        assert!(Cli::try_parse_from(["x", "--log-format", "xml"]).is_err());
        assert!(Cli::try_parse_from(["x", "--metrics-bind-address", "nowhere"]).is_err());
    }
}
