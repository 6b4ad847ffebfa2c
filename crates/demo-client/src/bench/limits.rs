//! The generator's own limits: enough file descriptors for its in-flight cap.

/// File descriptors kept apart from the in-flight requests' connections: 64 (the runtime,
/// standard streams, the children's pipes and logs, Envoy's admin probe).
pub const SPARE_DESCRIPTORS: u64 = 64;

/// Raises this process's soft limit on open files to its hard limit (as `demo-server`
/// does) and returns the in-flight cap that fits under it: `wanted`, or the limit less
/// [`SPARE_DESCRIPTORS`] with a message saying why it was lowered. Each request in flight
/// holds a connection, so a cap over the limit would make the generator's own `EMFILE` look
/// like the system's failures.
pub fn fit_in_flight(wanted: usize) -> (usize, Option<String>) {
    #[cfg(unix)]
    {
        use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
        let limit = getrlimit(Resource::Nofile);
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        let soft = match setrlimit(Resource::Nofile, raised) {
            Ok(()) => limit.maximum,
            Err(_) => limit.current,
        };
        clamp(wanted, soft)
    }
    #[cfg(not(unix))]
    {
        (wanted, None)
    }
}

/// `wanted` under a soft limit of `soft` descriptors (`None`: unlimited).
fn clamp(wanted: usize, soft: Option<u64>) -> (usize, Option<String>) {
    let Some(soft) = soft else {
        return (wanted, None);
    };
    let room = usize::try_from(soft.saturating_sub(SPARE_DESCRIPTORS))
        .unwrap_or(usize::MAX)
        .max(1);
    if wanted <= room {
        (wanted, None)
    } else {
        (
            room,
            Some(format!(
                "--max-in-flight {wanted} lowered to {room}: the open-file limit is {soft} \
                 and {SPARE_DESCRIPTORS} are kept for the rest"
            )),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cap_is_lowered_under_the_open_file_limit_with_a_message() {
        assert_eq!(clamp(4096, None), (4096, None));
        assert_eq!(clamp(4096, Some(20_000)), (4096, None));
        let (cap, message) = clamp(4096, Some(1024));
        assert_eq!(cap, 960);
        assert_eq!(
            message.unwrap(),
            "--max-in-flight 4096 lowered to 960: the open-file limit is 1024 and 64 are kept for the rest"
        );
        assert_eq!(clamp(10, Some(3)).0, 1);
    }

    #[cfg(unix)]
    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        use rustix::process::{Resource, getrlimit};
        let _ = fit_in_flight(16);
        let limit = getrlimit(Resource::Nofile);
        assert_eq!(limit.current, limit.maximum);
    }
}
