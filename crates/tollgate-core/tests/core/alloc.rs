//! The hot path allocates nothing: a counting global allocator, per thread.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use tollgate_core::{decide, GuardConfig, Money, Params, SessionState, ToolCall};

use crate::support::{call, params, step, usd};

struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let _ = ALLOCATIONS.try_with(|c| c.set(c.get() + 1));
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations_in(f: impl FnOnce()) -> u64 {
    let before = ALLOCATIONS.with(Cell::get);
    f();
    ALLOCATIONS.with(Cell::get) - before
}

#[test]
fn the_counter_counts() {
    // Guards against a test that cannot fail: the counter must see a real allocation.
    let n = allocations_in(|| {
        let v: Vec<u64> = std::hint::black_box(Vec::with_capacity(8));
        drop(v);
    });
    assert_eq!(n, 1);
}

#[test]
fn decide_and_params_hashing_allocate_nothing() {
    let config = GuardConfig {
        budget: usd(10.0),
        max_repeat_calls: 3,
        error_amplification: true,
        window_duration_s: 60,
        window_max_calls: 100,
        max_total_calls: 1000,
        ..GuardConfig::default()
    };
    let p = params(
        r#"{"query":"weather in paris","limit":10,"filters":{"lang":["en","fr"],"ratio":0.25}}"#,
    );
    let mut state = SessionState::new(config.budget, 0);
    let raw = r#"{"query":"weather in paris","last_error":"HTTP 503 service unavailable"}"#;
    // Warm up: build the error-signal automaton and a repeat run.
    for n in 1..=3 {
        step(&config, &mut state, &call("search", &p, n, usd(0.01)), n, 0);
    }
    let warm = ToolCall {
        raw_params: Some(raw),
        ..call("search", &p, 9, usd(0.01))
    };
    let _ = decide(&config, &state, &warm, 0, 1.0);

    // Classifying and hashing params.
    let n = allocations_in(|| {
        std::hint::black_box(Params::json(std::hint::black_box(&p)));
    });
    assert_eq!(n, 0, "Params::json allocated");

    // A typical ALLOW.
    let other = params(r#"{"query":"weather in rome"}"#);
    let allow = call("search", &other, 10, usd(0.01));
    let n = allocations_in(|| {
        let d = decide(&config, &state, std::hint::black_box(&allow), 1, 1.0);
        assert_eq!(d.verdict, tollgate_core::Verdict::Allow);
    });
    assert_eq!(n, 0, "decide (ALLOW) allocated");

    // The repeat path with the error scan over raw params.
    let repeat = ToolCall {
        raw_params: Some(raw),
        ..call("search", &p, 11, usd(0.01))
    };
    let n = allocations_in(|| {
        let d = decide(&config, &state, std::hint::black_box(&repeat), 1, 1.0);
        assert_eq!(d.reason, tollgate_core::Reason::MaxRepeatExceeded);
    });
    assert_eq!(n, 0, "decide (repeat + error scan) allocated");

    // DENY on a tripped circuit.
    state.circuit_tripped = true;
    let n = allocations_in(|| {
        let d = decide(&config, &state, std::hint::black_box(&allow), 1, 1.0);
        assert_eq!(d.reason, tollgate_core::Reason::CircuitOpen);
    });
    assert_eq!(n, 0, "decide (circuit open) allocated");
    let _ = Money::ZERO;
}
