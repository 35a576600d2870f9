//! The CPU time the calling thread has used: what `script_cpu_ms_max` bounds. A wall clock would
//! count time the script never had (the node stopped with SIGSTOP, its thread descheduled on a
//! loaded machine, a pause of the whole host), and fail a workflow for it.

use std::time::Duration;

/// CPU time used by the calling thread so far.
pub(crate) fn thread_cpu_time() -> Duration {
    let mut now = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `now` is a valid, writable timespec, and CLOCK_THREAD_CPUTIME_ID is supported by
    // every Linux kernel reins runs on; on the impossible failure the zeroed value is returned,
    // which only postpones the interrupt.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut now) };
    Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sleeping_uses_no_cpu_time_and_working_does() {
        let before = thread_cpu_time();
        std::thread::sleep(Duration::from_millis(300));
        let slept = thread_cpu_time() - before;
        assert!(slept < Duration::from_millis(100), "{slept:?} while asleep");
        let before = thread_cpu_time();
        let started = std::time::Instant::now();
        let mut x = 0u64;
        while started.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(thread_cpu_time() - before > Duration::ZERO, "{x}");
    }
}
