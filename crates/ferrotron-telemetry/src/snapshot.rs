//! The encoded metrics, gathered and formatted at most once per [`MAX_AGE`].
//!
//! Gathering every metric and formatting the text costs about a quarter of a millisecond; a
//! client polling thousands of times a second would make that the trainer process's busiest
//! thread. Serving the same text for up to 100 ms turns a flood into socket work only, and no
//! scraper can tell: Prometheus scrapes every 15 s or more.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use prometheus::Registry;

use crate::metrics::encode;

/// How long one encoding is served.
pub(crate) const MAX_AGE: Duration = Duration::from_millis(100);

pub(crate) struct Snapshot {
    registry: Registry,
    max_age: Duration,
    cached: Mutex<Option<(Instant, Arc<str>)>>,
}

impl Snapshot {
    pub(crate) fn new(registry: Registry) -> Self {
        Self::with_max_age(registry, MAX_AGE)
    }

    pub(crate) fn with_max_age(registry: Registry, max_age: Duration) -> Self {
        Self {
            registry,
            max_age,
            cached: Mutex::new(None),
        }
    }

    /// The metrics text, encoded now or at most `max_age` ago.
    pub(crate) fn text(&self) -> Result<Arc<str>, prometheus::Error> {
        let mut cached = self.cached.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((at, text)) = cached.as_ref()
            && at.elapsed() < self.max_age
        {
            return Ok(Arc::clone(text));
        }
        let text: Arc<str> = encode(&self.registry)?.into();
        *cached = Some((Instant::now(), Arc::clone(&text)));
        Ok(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus::IntGauge;

    fn registry_with(gauge: &IntGauge) -> Registry {
        let registry = Registry::new();
        registry
            .register(Box::new(gauge.clone()))
            .expect("registers");
        registry
    }

    #[test]
    fn within_its_age_the_same_text_is_served() {
        let gauge = IntGauge::new("g", "a gauge").expect("gauge");
        let snapshot = Snapshot::with_max_age(registry_with(&gauge), Duration::from_secs(3600));
        gauge.set(1);
        let first = snapshot.text().expect("encodes");
        gauge.set(2);
        assert_eq!(snapshot.text().expect("encodes"), first);
        assert!(first.contains("g 1"), "{first}");
    }

    #[test]
    fn past_its_age_the_text_is_encoded_again() {
        let gauge = IntGauge::new("g", "a gauge").expect("gauge");
        let snapshot = Snapshot::with_max_age(registry_with(&gauge), Duration::ZERO);
        gauge.set(1);
        assert!(snapshot.text().expect("encodes").contains("g 1"));
        gauge.set(2);
        assert!(snapshot.text().expect("encodes").contains("g 2"));
    }
}
