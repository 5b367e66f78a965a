//! How many requests go to one Proxmox VE endpoint at once.
//!
//! At most the configured limit ([`crate::MAX_IN_FLIGHT`] by default: pveproxy's three workers
//! serve the API, more requests only queue inside it), waiting requests served in turn (a fair
//! semaphore). When the server says it is overloaded (`429 Too Many Requests`,
//! `503 Service Unavailable`, as pveproxy or a proxy in front of it answers), or does not answer
//! within the request's timeout (pveproxy queues what its workers cannot take), the limit
//! halves, and a `Retry-After` holds every new request until it has passed; after a window of
//! answered requests (as many as the current limit) it grows back by one: additive increase,
//! multiplicative decrease, as TCP's congestion control does. Clients that ask for it share the
//! limiter of their endpoint ([`Limiter::shared`]), so many ProxmoxClusters on one host do not
//! add up to more than the host bears.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock, Weak};
use std::time::Duration;

use tokio::sync::{Semaphore, SemaphorePermit};
use tokio::time::Instant;

/// The longest `Retry-After` honoured: a server asking for more is asked again after this.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(60);

/// The bound on one endpoint's requests in flight, adapted to the server's overload answers.
/// Requests wait in order (a fair semaphore of the current limit's permits).
#[derive(Debug)]
pub struct Limiter {
    max: usize,
    permits: Semaphore,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    /// Requests allowed in flight now (1..=max).
    limit: usize,
    /// Requests answered (not overloaded) since the limit last changed.
    answered: usize,
    /// No request starts before this instant (a `Retry-After`).
    hold_until: Option<Instant>,
    /// How many times the limit was cut: the overload answers of requests that started before
    /// the last cut are that one overload, not one each.
    cuts: u64,
    /// Permits a cut took away while they were in use: forgotten as they come back.
    owed: usize,
}

/// A request's slot; the slot is free again when this is dropped.
#[derive(Debug)]
pub struct Slot<'a> {
    limiter: &'a Limiter,
    permit: Option<SemaphorePermit<'a>>,
    /// The limiter's cut count when the request started.
    cuts: u64,
}

impl Limiter {
    /// A limiter of its own, for `max` requests at once (at least one).
    pub fn new(max: usize) -> Self {
        let max = max.max(1);
        Self {
            max,
            permits: Semaphore::new(max),
            state: Mutex::new(State {
                limit: max,
                answered: 0,
                hold_until: None,
                cuts: 0,
                owed: 0,
            }),
        }
    }

    /// The limiter of endpoint `base` (the client's normalised URL, e.g.
    /// `https://pve.example.com:8006`), shared by every client of it in this process while one
    /// holds it; `max` applies when it is made.
    pub fn shared(base: &str, max: usize) -> Arc<Self> {
        static BY_ENDPOINT: OnceLock<Mutex<HashMap<String, Weak<Limiter>>>> = OnceLock::new();
        let mut map = BY_ENDPOINT
            .get_or_init(Mutex::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        map.retain(|_, limiter| limiter.strong_count() > 0);
        let key = base.trim_end_matches('/').to_ascii_lowercase();
        if let Some(limiter) = map.get(&key).and_then(Weak::upgrade) {
            return limiter;
        }
        let limiter = Arc::new(Self::new(max));
        map.insert(key, Arc::downgrade(&limiter));
        limiter
    }

    /// The configured bound.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Requests allowed in flight now.
    pub fn limit(&self) -> usize {
        self.lock().limit
    }

    /// Waits for a slot: its turn among the waiting requests, and no `Retry-After` holding.
    pub async fn acquire(&self) -> Slot<'_> {
        self.wait_out_hold().await;
        // The semaphore is never closed: an error cannot happen (and would only mean no bound).
        let permit = self.permits.acquire().await.ok();
        // A Retry-After that came while this request waited for its turn holds it too.
        self.wait_out_hold().await;
        Slot {
            limiter: self,
            permit,
            cuts: self.lock().cuts,
        }
    }

    async fn wait_out_hold(&self) {
        loop {
            let hold = self.lock().hold_until;
            match hold {
                Some(until) if until > Instant::now() => tokio::time::sleep_until(until).await,
                _ => return,
            }
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Slot<'_> {
    /// The request was answered without an overload: after as many answers as the limit, the
    /// limit grows by one (up to the configured bound).
    pub fn answered(&self) {
        let mut state = self.limiter.lock();
        state.answered += 1;
        if state.limit < self.limiter.max && state.answered >= state.limit {
            state.limit += 1;
            state.answered = 0;
            if state.owed > 0 {
                state.owed -= 1;
            } else {
                self.limiter.permits.add_permits(1);
            }
        }
    }

    /// The server answered with an overload (429 or 503), maybe with a `Retry-After`, or did
    /// not answer in time: the limit halves (once for all the requests that had started before
    /// it was last cut), and no request starts before `retry_after` has passed.
    pub fn overloaded(&self, retry_after: Option<Duration>) {
        let mut state = self.limiter.lock();
        if self.cuts == state.cuts {
            let limit = (state.limit / 2).max(1);
            let taken = state.limit - limit;
            let forgotten = self.limiter.permits.forget_permits(taken);
            state.owed += taken - forgotten;
            state.limit = limit;
            state.answered = 0;
            state.cuts += 1;
        }
        if let Some(wait) = retry_after {
            let until = Instant::now() + honoured(wait);
            state.hold_until = Some(state.hold_until.map_or(until, |held| held.max(until)));
        }
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        let Some(permit) = self.permit.take() else {
            return;
        };
        let mut state = self.limiter.lock();
        if state.owed > 0 {
            state.owed -= 1;
            permit.forget();
        }
    }
}

/// How long a `Retry-After` of `wait` holds requests: at most [`MAX_RETRY_AFTER`].
fn honoured(wait: Duration) -> Duration {
    wait.min(MAX_RETRY_AFTER)
}

/// A `Retry-After` header's delay: seconds (`120`); an HTTP date is not honoured (the limit's
/// halving and the request's own backoff still apply).
pub fn retry_after(headers: &http::HeaderMap) -> Option<Duration> {
    let value = headers.get(http::header::RETRY_AFTER)?.to_str().ok()?;
    value.trim().parse::<u64>().ok().map(Duration::from_secs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    /// Whether `future` is ready when polled once.
    fn ready_now<F: Future>(future: std::pin::Pin<&mut F>) -> Option<F::Output> {
        match future.poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(output) => Some(output),
            Poll::Pending => None,
        }
    }

    #[tokio::test]
    async fn an_overload_halves_the_limit_and_answers_grow_it_back_one_at_a_time() {
        let limiter = Limiter::new(6);
        let first = limiter.acquire().await;
        first.overloaded(None);
        drop(first);
        assert_eq!(limiter.limit(), 3);

        let slots = [
            limiter.acquire().await,
            limiter.acquire().await,
            limiter.acquire().await,
        ];
        let mut fourth = pin!(limiter.acquire());
        assert!(
            ready_now(fourth.as_mut()).is_none(),
            "a fourth request waits at limit 3"
        );
        for slot in &slots {
            slot.answered();
        }
        assert_eq!(limiter.limit(), 4, "three answers at limit 3 grow it by one");
        let fourth = fourth.await;
        fourth.answered();
        assert_eq!(limiter.limit(), 4, "one answer at limit 4 is not a window yet");
    }

    #[tokio::test]
    async fn the_overloads_of_requests_already_in_flight_cut_the_limit_once() {
        let limiter = Limiter::new(6);
        let slots = acquire_n(&limiter, 6).await;
        for slot in &slots {
            slot.overloaded(None);
        }
        assert_eq!(limiter.limit(), 3, "six 503s of one burst are one overload");
        drop(slots);
        let late = limiter.acquire().await;
        late.overloaded(None);
        assert_eq!(limiter.limit(), 1, "a request sent after the cut counts again");
        drop(late);
        let later = limiter.acquire().await;
        later.overloaded(None);
        assert_eq!(limiter.limit(), 1, "never below one");
    }

    #[tokio::test]
    async fn waiting_requests_are_served_in_turn() {
        let limiter = Limiter::new(1);
        let first = limiter.acquire().await;
        let mut second = pin!(limiter.acquire());
        assert!(ready_now(second.as_mut()).is_none(), "the second waits its turn");
        drop(first);
        let mut third = pin!(limiter.acquire());
        assert!(
            ready_now(third.as_mut()).is_none(),
            "a later request does not take the freed slot from the one waiting"
        );
        let second = second.await;
        drop(second);
        let _third = third.await;
    }

    #[tokio::test]
    async fn no_request_starts_before_a_retry_after_has_passed() {
        let limiter = Limiter::new(6);
        let slot = limiter.acquire().await;
        slot.overloaded(Some(Duration::from_secs(1)));
        let asked = Instant::now();
        drop(slot);
        let mut next = pin!(limiter.acquire());
        assert!(
            ready_now(next.as_mut()).is_none(),
            "held while the Retry-After runs"
        );
        let _next = next.await;
        assert!(
            asked.elapsed() >= Duration::from_secs(1),
            "waited {:?}",
            asked.elapsed()
        );
    }

    #[test]
    fn a_retry_after_holds_requests_for_at_most_a_minute() {
        assert_eq!(honoured(Duration::from_secs(7)), Duration::from_secs(7));
        assert_eq!(honoured(Duration::from_secs(3600)), MAX_RETRY_AFTER);
    }

    #[test]
    fn retry_after_is_read_in_seconds() {
        let mut headers = http::HeaderMap::new();
        assert_eq!(retry_after(&headers), None);
        headers.insert(http::header::RETRY_AFTER, "7".parse().unwrap());
        assert_eq!(retry_after(&headers), Some(Duration::from_secs(7)));
        headers.insert(
            http::header::RETRY_AFTER,
            "Wed, 21 Oct 2026 07:28:00 GMT".parse().unwrap(),
        );
        assert_eq!(retry_after(&headers), None);
    }

    #[test]
    fn clients_of_one_endpoint_share_a_limiter() {
        let a = Limiter::shared("https://PVE.example.com:8006/", 6);
        let b = Limiter::shared("https://pve.example.com:8006", 3);
        let other = Limiter::shared("https://pve2.example.com:8006", 6);
        assert!(Arc::ptr_eq(&a, &b));
        assert_eq!(b.max(), 6, "the first client's bound holds");
        assert!(!Arc::ptr_eq(&a, &other));
    }

    async fn acquire_n(limiter: &Limiter, n: usize) -> Vec<Slot<'_>> {
        let mut slots = Vec::new();
        for _ in 0..n {
            slots.push(limiter.acquire().await);
        }
        slots
    }
}
