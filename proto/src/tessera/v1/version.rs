//! The protocol-revision window of `tessera.v1`, in code rather than only in prose.

use super::Reject;

/// Revision of `tessera.v1` this build speaks (sent in `Hello.protocol_version`).
pub const PROTOCOL_VERSION: u32 = 2;

/// Oldest agent revision a coordinator of this build accepts: one revision back, so a
/// rolling upgrade (coordinator first, then agents) never drops an agent.
pub const MIN_ACCEPTED_PROTOCOL_VERSION: u32 = PROTOCOL_VERSION.saturating_sub(1);

/// TCP port the coordinator serves `AgentService` on unless configured otherwise.
pub const DEFAULT_COORDINATOR_PORT: u16 = 7070;

/// Decides, on the coordinator side, which revision to speak with an agent that sent
/// `agent_version` in its Hello.
///
/// Returns the accepted revision (the lower of the two sides) for agents at
/// `coordinator_version - 1` or `coordinator_version`, and otherwise the `Reject` to
/// send back, whose reason tells the operator which side to upgrade. An agent newer
/// than the coordinator is rejected: it may rely on messages the coordinator does not
/// understand, and the fix is to upgrade the coordinator first.
pub fn negotiate_protocol(coordinator_version: u32, agent_version: u32) -> Result<u32, Reject> {
    let min = coordinator_version.saturating_sub(1);
    let reason = if agent_version < min {
        format!(
            "agent speaks tessera.v1 protocol {agent_version}, this coordinator accepts \
             {min}..={coordinator_version}: upgrade the agent"
        )
    } else if agent_version > coordinator_version {
        format!(
            "agent speaks tessera.v1 protocol {agent_version}, this coordinator accepts \
             {min}..={coordinator_version}: upgrade the coordinator before the agents"
        )
    } else {
        return Ok(agent_version);
    };
    Err(Reject {
        min_protocol_version: min,
        max_protocol_version: coordinator_version,
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_and_previous_revision_are_accepted_at_the_lower_one() {
        assert_eq!(negotiate_protocol(3, 3), Ok(3));
        assert_eq!(negotiate_protocol(3, 2), Ok(2));
    }

    #[test]
    fn older_agents_are_told_to_upgrade() {
        let reject = negotiate_protocol(3, 1).unwrap_err();
        assert_eq!(
            (reject.min_protocol_version, reject.max_protocol_version),
            (2, 3)
        );
        assert!(
            reject.reason.contains("upgrade the agent"),
            "{}",
            reject.reason
        );
    }

    #[test]
    fn newer_agents_are_told_to_upgrade_the_coordinator() {
        let reject = negotiate_protocol(3, 4).unwrap_err();
        assert!(
            reject.reason.contains("upgrade the coordinator"),
            "{}",
            reject.reason
        );
    }

    #[test]
    fn first_revision_has_no_predecessor_to_underflow() {
        assert_eq!(negotiate_protocol(1, 0), Ok(0));
        assert_eq!(MIN_ACCEPTED_PROTOCOL_VERSION, PROTOCOL_VERSION - 1);
    }
}
