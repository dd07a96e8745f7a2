//! Readiness as a set of named gates: `/readyz` answers 200 only when every gate a component
//! registered has been released once (every cache synced, the webhook certificate loaded and
//! its port bound), and never again after shutdown began.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};

use warmcache_telemetry::Readiness;

#[derive(Debug, Default)]
struct State {
    /// Gate name -> released.
    gates: BTreeMap<String, bool>,
    /// Registrations of one name, so two gates of one name are tracked apart.
    counts: BTreeMap<String, usize>,
    shutting_down: bool,
}

/// The gates of one process, driving the [`Readiness`] flag the admin server reports.
#[derive(Clone, Debug)]
pub struct Gates {
    state: Arc<Mutex<State>>,
    readiness: Readiness,
}

impl Gates {
    /// Gates driving `readiness`. With no gate registered the process is ready once
    /// [`Gates::start`] is called.
    pub fn new(readiness: Readiness) -> Self {
        let gates = Self {
            state: Arc::new(Mutex::new(State::default())),
            readiness,
        };
        gates.readiness.set_not_ready("starting");
        gates
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut State) -> R) -> R {
        let mut guard = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let result = f(&mut guard);
        self.publish(&guard);
        result
    }

    fn publish(&self, state: &State) {
        if state.shutting_down {
            self.readiness.set_not_ready("shutting down");
            return;
        }
        let waiting: Vec<&str> = state
            .gates
            .iter()
            .filter(|(_, released)| !**released)
            .map(|(name, _)| name.as_str())
            .collect();
        if waiting.is_empty() {
            self.readiness.set_ready(true);
        } else {
            self.readiness
                .set_not_ready(format!("waiting for: {}", waiting.join(", ")));
        }
    }

    /// Registers a gate; the process is not ready until it is released.
    pub fn gate(&self, name: &str) -> Gate {
        let key = self.with_state(|state| {
            let count = state.counts.entry(name.to_owned()).or_insert(0);
            *count += 1;
            let key = if *count == 1 {
                name.to_owned()
            } else {
                format!("{name} #{count}")
            };
            state.gates.insert(key.clone(), false);
            key
        });
        Gate {
            gates: self.clone(),
            key,
        }
    }

    /// Marks the process not ready for good: shutdown began.
    pub fn shutting_down(&self) {
        self.with_state(|state| state.shutting_down = true);
    }

    /// The names of the gates not yet released.
    pub fn waiting(&self) -> Vec<String> {
        self.with_state(|state| {
            state
                .gates
                .iter()
                .filter(|(_, released)| !**released)
                .map(|(name, _)| name.clone())
                .collect()
        })
    }

    /// The flag the admin server reports.
    pub fn readiness(&self) -> &Readiness {
        &self.readiness
    }

    fn release(&self, key: &str) {
        self.with_state(|state| {
            if let Some(released) = state.gates.get_mut(key) {
                *released = true;
            }
        });
    }
}

/// One readiness gate. Releasing it is final: a cache that resyncs later, or a certificate
/// reload, does not make the process unready again (a restarting watch keeps serving its last
/// state).
#[derive(Debug)]
pub struct Gate {
    gates: Gates,
    key: String,
}

impl Gate {
    /// Releases the gate.
    pub fn release(&self) {
        self.gates.release(&self.key);
    }

    /// The gate's name as `/readyz` shows it.
    pub fn name(&self) -> &str {
        &self.key
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_only_when_every_gate_is_released_and_never_after_shutdown() {
        let readiness = Readiness::new();
        let gates = Gates::new(readiness.clone());
        let pods = gates.gate("pods cache");
        let again = gates.gate("pods cache");
        let cert = gates.gate("webhook certificate");
        assert_eq!(
            readiness.check(),
            Err("waiting for: pods cache, pods cache #2, webhook certificate".to_owned())
        );
        pods.release();
        cert.release();
        assert_eq!(
            readiness.check(),
            Err("waiting for: pods cache #2".to_owned())
        );
        again.release();
        assert!(readiness.is_ready());
        again.release();
        assert!(readiness.is_ready());
        // A gate added later holds readiness back again until released.
        let late = gates.gate("leases cache");
        assert!(!readiness.is_ready());
        late.release();
        assert!(readiness.is_ready());
        gates.shutting_down();
        assert_eq!(readiness.check(), Err("shutting down".to_owned()));
        gates.gate("x").release();
        assert!(!readiness.is_ready());
        assert!(gates.waiting().is_empty());
    }
}
