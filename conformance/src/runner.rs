//! Running one property on every backend present.

use crate::backends::{backends, cases, report_skipped};
use calico::Device;
use proptest::strategy::Strategy;
use proptest::test_runner::{Config, TestCaseError, TestRunner};

/// Proptest settings: `default_cases` (or `CALICO_CONFORMANCE_CASES`), no regression files
/// written next to the sources (the binary may run on a machine without them), and bounded
/// shrinking (a GPU failure re-runs kernels at every step).
pub fn config(default_cases: u32) -> Config {
    Config {
        cases: cases(default_cases),
        failure_persistence: None,
        max_shrink_iters: 256,
        ..Config::default()
    }
}

/// Checks `case` for every value `strategy` draws, on every backend present, after printing
/// which backends are skipped. Panics with the (shrunk) failing input and the backend.
pub fn property<S: Strategy>(
    test: &str,
    default_cases: u32,
    strategy: S,
    case: impl Fn(&Device, &S::Value) -> Result<(), String>,
) {
    report_skipped(test);
    for dev in backends().0 {
        let mut runner = TestRunner::new(config(default_cases));
        let result = runner.run(&strategy, |v| case(&dev, &v).map_err(TestCaseError::fail));
        if let Err(e) = result {
            panic!("{test} on backend {}: {e}", dev.kind());
        }
    }
}

/// `Result` of a Calico call, with the call named in the message (so an `Unsupported` on a
/// GPU reads as that backend's failure, not as a skip).
pub trait Ctx<T> {
    fn ctx(self, what: &str) -> Result<T, String>;
}

impl<T> Ctx<T> for calico::Result<T> {
    fn ctx(self, what: &str) -> Result<T, String> {
        self.map_err(|e| match e {
            calico::Error::Unsupported(_) => format!(
                "{what} returned Err: {e} (Unsupported counts as a failure: every backend \
                 present must implement every op)"
            ),
            e => format!("{what} returned Err: {e}"),
        })
    }
}
