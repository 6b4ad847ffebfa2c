//! The CPU time of a process, to tell a generator (or a proxy) that ran out of CPU from a
//! system that did. Linux only: read from `/proc/PID/stat`; `None` elsewhere.

use std::time::Duration;

/// The CPU time (user and system, every thread) the process `pid` has used so far, or this
/// process's with `None`; `None` when `/proc` cannot be read (not Linux, or the process is
/// gone).
pub fn cpu_time(pid: Option<u32>) -> Option<Duration> {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/stat"),
        None => "/proc/self/stat".to_owned(),
    };
    let stat = std::fs::read_to_string(path).ok()?;
    cpu_time_of_stat(&stat, rustix::param::clock_ticks_per_second())
}

/// utime + stime (fields 14 and 15 of `stat`, in clock ticks) as a duration. The second
/// field, the command name, is in parentheses and may hold spaces: the fields are counted
/// after its closing parenthesis.
fn cpu_time_of_stat(stat: &str, ticks_per_second: u64) -> Option<Duration> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    let mut fields = after_name.split_whitespace();
    // After the name come the state (field 3) .. utime is field 14, stime 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    if ticks_per_second == 0 {
        return None;
    }
    let ticks = utime + stime;
    Some(
        Duration::from_secs(ticks / ticks_per_second)
            + Duration::from_secs_f64((ticks % ticks_per_second) as f64 / ticks_per_second as f64),
    )
}

/// The machine's cores, as the share's denominator: 1 when unknown.
pub fn cores() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn user_and_system_ticks_are_read_after_the_command_name() {
        let stat =
            "4242 (tokio (rt) x) S 1 4242 4242 0 -1 4194560 1234 0 0 0 150 75 0 0 20 0 3 0 100 0 0";
        assert_eq!(
            cpu_time_of_stat(stat, 100),
            Some(Duration::from_millis(2250))
        );
        assert_eq!(cpu_time_of_stat("garbage", 100), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_process_has_used_some_cpu() {
        let mut x = 0u64;
        for i in 0..20_000_000u64 {
            x = x.wrapping_add(i * i);
        }
        assert!(x > 0);
        assert!(cpu_time(None).is_some_and(|t| t > Duration::ZERO));
    }
}
