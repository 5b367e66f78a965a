//! Deterministic fault injection: rules matched by method and path that fail, delay, drop or make
//! tasks fail, plus "expire all tickets".

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use regex::Regex;
use serde::{Deserialize, Serialize};

/// Which request paths a rule applies to (API-relative, e.g. `/nodes/pve1/qemu/100/clone`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum PathMatch {
    /// Every path.
    #[default]
    Any,
    /// Paths starting with this prefix.
    Prefix(String),
    /// Paths matching this regular expression (unanchored).
    Regex(String),
}

/// When a matching call is affected.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum Trigger {
    /// Every matching call.
    #[default]
    Always,
    /// Only the N-th matching call (1-based).
    Nth(u64),
    /// The first N matching calls.
    FirstN(u64),
    /// Each matching call with probability p (drawn from the seeded generator).
    Probability(f64),
}

/// What happens to an affected call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FaultEffect {
    /// Answer with this HTTP status and PVE error message (`{"data":null,"message":"…\n"}`).
    Status {
        /// HTTP status code (500, 503, 595, ...).
        code: u16,
        /// The message; its first line is the status line's reason.
        message: String,
    },
    /// Delay the answer, then proceed normally.
    Latency {
        /// Added delay in milliseconds.
        millis: u64,
    },
    /// Let the call succeed, but the task it starts fails with this `exitstatus`.
    TaskFailure {
        /// The exit status text (e.g. `clone failed: out of space`).
        exitstatus: String,
    },
    /// Close the connection without an answer.
    DropConnection,
}

/// One fault rule.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FaultRule {
    /// HTTP method to match (any when `None`).
    #[serde(default)]
    pub method: Option<String>,
    /// Path to match.
    #[serde(default)]
    pub path: PathMatch,
    /// Which matching calls are affected.
    #[serde(default)]
    pub trigger: Trigger,
    /// The effect.
    pub effect: FaultEffect,
}

impl FaultRule {
    /// A rule with `effect` on every call.
    pub fn new(effect: FaultEffect) -> Self {
        Self {
            method: None,
            path: PathMatch::Any,
            trigger: Trigger::Always,
            effect,
        }
    }
    /// Answer with an HTTP error status and message.
    pub fn status(code: u16, message: impl Into<String>) -> Self {
        Self::new(FaultEffect::Status {
            code,
            message: message.into(),
        })
    }
    /// Add latency.
    pub fn latency(delay: Duration) -> Self {
        Self::new(FaultEffect::Latency {
            millis: delay.as_millis().try_into().unwrap_or(u64::MAX),
        })
    }
    /// Make the started task fail with `exitstatus`.
    pub fn task_failure(exitstatus: impl Into<String>) -> Self {
        Self::new(FaultEffect::TaskFailure {
            exitstatus: exitstatus.into(),
        })
    }
    /// Drop the connection.
    pub fn drop_connection() -> Self {
        Self::new(FaultEffect::DropConnection)
    }
    /// Restrict to one HTTP method.
    pub fn method(mut self, method: &str) -> Self {
        self.method = Some(method.to_ascii_uppercase());
        self
    }
    /// Restrict to paths with this prefix.
    pub fn path_prefix(mut self, prefix: impl Into<String>) -> Self {
        self.path = PathMatch::Prefix(prefix.into());
        self
    }
    /// Restrict to paths matching this regex.
    pub fn path_regex(mut self, regex: impl Into<String>) -> Self {
        self.path = PathMatch::Regex(regex.into());
        self
    }
    /// Affect only the N-th matching call (1-based).
    pub fn nth(mut self, n: u64) -> Self {
        self.trigger = Trigger::Nth(n);
        self
    }
    /// Affect the first N matching calls.
    pub fn first(mut self, n: u64) -> Self {
        self.trigger = Trigger::FirstN(n);
        self
    }
    /// Affect each matching call with probability `p`.
    pub fn probability(mut self, p: f64) -> Self {
        self.trigger = Trigger::Probability(p);
        self
    }
}

/// A rule that cannot be installed.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// The path regex does not compile.
    #[error("invalid path regex {pattern:?}")]
    Regex {
        /// The pattern.
        pattern: String,
        /// The regex error.
        #[source]
        source: regex::Error,
    },
    /// The probability is outside 0..=1.
    #[error("probability {0} is not within 0..=1")]
    Probability(f64),
    /// The status code is not an error status.
    #[error("status {0} is not an HTTP error status (400..=599)")]
    Status(u16),
}

#[derive(Debug)]
struct Installed {
    rule: FaultRule,
    regex: Option<Regex>,
    calls: u64,
    fired: u64,
}

#[derive(Debug)]
struct Inner {
    rules: Vec<Installed>,
    rng: ChaCha8Rng,
    ticket_epoch: u64,
}

/// Cloneable handle on the simulator's fault rules. Deterministic for a given seed and call order.
#[derive(Debug, Clone)]
pub struct FaultInjector {
    inner: Arc<Mutex<Inner>>,
}

impl FaultInjector {
    /// A new injector with no rules, drawing probabilities from a generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        let inner = Inner {
            rules: Vec::new(),
            rng: ChaCha8Rng::seed_from_u64(seed),
            ticket_epoch: 0,
        };
        Self {
            inner: Arc::new(Mutex::new(inner)),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Installs a rule; returns its index.
    pub fn add(&self, rule: FaultRule) -> Result<usize, FaultError> {
        let regex = match &rule.path {
            PathMatch::Regex(p) => Some(Regex::new(p).map_err(|source| FaultError::Regex {
                pattern: p.clone(),
                source,
            })?),
            _ => None,
        };
        if let Trigger::Probability(p) = rule.trigger
            && !(0.0..=1.0).contains(&p)
        {
            return Err(FaultError::Probability(p));
        }
        if let FaultEffect::Status { code, .. } = rule.effect
            && !(400..=599).contains(&code)
        {
            return Err(FaultError::Status(code));
        }
        let mut inner = self.lock();
        inner.rules.push(Installed {
            rule,
            regex,
            calls: 0,
            fired: 0,
        });
        Ok(inner.rules.len() - 1)
    }

    /// Restarts the random generator from `seed` (a test replaying a run).
    pub fn reseed(&self, seed: u64) {
        self.lock().rng = ChaCha8Rng::seed_from_u64(seed);
    }

    /// Removes all rules (the random generator keeps its position).
    pub fn clear(&self) {
        self.lock().rules.clear();
    }

    /// The installed rules.
    pub fn rules(&self) -> Vec<FaultRule> {
        self.lock().rules.iter().map(|r| r.rule.clone()).collect()
    }

    /// How many calls each installed rule has affected, in rule order (a test can check that
    /// what it injected did happen).
    pub fn fired(&self) -> Vec<u64> {
        self.lock().rules.iter().map(|r| r.fired).collect()
    }

    /// Invalidates every ticket issued so far (API tokens are unaffected).
    pub fn expire_all_tickets(&self) {
        self.lock().ticket_epoch += 1;
    }

    /// The current ticket epoch; tickets from an older epoch are expired.
    pub(crate) fn ticket_epoch(&self) -> u64 {
        self.lock().ticket_epoch
    }

    /// Evaluates the rules for one call and returns the effects that fire, in rule order.
    pub fn evaluate(&self, method: &str, path: &str) -> Vec<FaultEffect> {
        let mut inner = self.lock();
        let Inner { rules, rng, .. } = &mut *inner;
        let mut out = Vec::new();
        for installed in rules.iter_mut() {
            let rule = &installed.rule;
            if rule
                .method
                .as_deref()
                .is_some_and(|m| !m.eq_ignore_ascii_case(method))
            {
                continue;
            }
            let matches = match (&rule.path, &installed.regex) {
                (PathMatch::Any, _) => true,
                (PathMatch::Prefix(p), _) => path.starts_with(p.as_str()),
                (PathMatch::Regex(_), Some(re)) => re.is_match(path),
                (PathMatch::Regex(_), None) => false,
            };
            if !matches {
                continue;
            }
            installed.calls += 1;
            let fire = match rule.trigger {
                Trigger::Always => true,
                Trigger::Nth(n) => installed.calls == n,
                Trigger::FirstN(n) => installed.calls <= n,
                Trigger::Probability(p) => rng.random::<f64>() < p,
            };
            if fire {
                installed.fired += 1;
                out.push(rule.effect.clone());
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pattern(seed: u64) -> Vec<bool> {
        let f = FaultInjector::new(seed);
        f.add(
            FaultRule::status(503, "busy")
                .path_prefix("/nodes")
                .probability(0.3),
        )
        .unwrap();
        (0..200)
            .map(|_| !f.evaluate("GET", "/nodes/pve1/status").is_empty())
            .collect()
    }

    #[test]
    fn probability_is_deterministic_per_seed() {
        let a = pattern(7);
        assert_eq!(a, pattern(7));
        assert_ne!(a, pattern(8));
        let hits = a.iter().filter(|h| **h).count();
        assert!((30..90).contains(&hits), "{hits} hits for p=0.3 out of 200");
    }

    #[test]
    fn fired_counts_the_affected_calls_per_rule() {
        let f = FaultInjector::new(3);
        f.add(FaultRule::status(503, "busy").path_prefix("/nodes").first(2))
            .unwrap();
        f.add(FaultRule::drop_connection().path_prefix("/version"))
            .unwrap();
        for _ in 0..5 {
            f.evaluate("GET", "/nodes/pve1/status");
        }
        assert_eq!(f.fired(), [2, 0]);
    }

    #[test]
    fn nth_and_first_n() {
        let f = FaultInjector::new(1);
        f.add(
            FaultRule::drop_connection()
                .method("post")
                .path_regex(r"/clone$")
                .nth(2),
        )
        .unwrap();
        f.add(FaultRule::status(500, "x").path_prefix("/version").first(2))
            .unwrap();
        let clone: Vec<usize> = (0..4)
            .map(|_| f.evaluate("POST", "/nodes/a/qemu/1/clone").len())
            .collect();
        assert_eq!(clone, [0, 1, 0, 0]);
        assert!(f.evaluate("GET", "/nodes/a/qemu/1/clone").is_empty());
        let version: Vec<usize> = (0..3).map(|_| f.evaluate("GET", "/version").len()).collect();
        assert_eq!(version, [1, 1, 0]);
        f.clear();
        assert!(f.rules().is_empty());
    }

    #[test]
    fn rejects_bad_rules() {
        let f = FaultInjector::new(1);
        assert!(matches!(
            f.add(FaultRule::status(200, "ok")),
            Err(FaultError::Status(200))
        ));
        assert!(matches!(
            f.add(FaultRule::drop_connection().probability(2.0)),
            Err(FaultError::Probability(_))
        ));
        assert!(matches!(
            f.add(FaultRule::drop_connection().path_regex("(")),
            Err(FaultError::Regex { .. })
        ));
    }
}
