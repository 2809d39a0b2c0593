//! Why an event left its queue without being delivered: one enum for the dead-letter record,
//! the metrics label and the logs.

/// Why an event left the queue without being delivered: the metrics label, the log field and
/// the dead-letter `reason` on the wire, all from [`DropReason::as_str`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DropReason {
    /// `maxDeliveryAttempts` reached or the schedule exhausted.
    MaxDeliveryAttemptsExceeded,
    /// Time to live passed.
    TimeToLiveExceeded,
    /// The endpoint refused the event for good (400/413 under the `standard` status-code
    /// policy with a dead-letter destination).
    DeliveryRefused,
    /// The subscription's in-memory queue was full at publish (`broker__queueFullPolicy =
    /// deadLetter`); never attempted.
    QueueFull,
}

impl DropReason {
    /// Every reason, in the order metrics list them.
    pub const ALL: [Self; 4] = [
        Self::MaxDeliveryAttemptsExceeded,
        Self::TimeToLiveExceeded,
        Self::DeliveryRefused,
        Self::QueueFull,
    ];

    /// Stable wire name (dead-letter `reason`, metrics label, logs).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::MaxDeliveryAttemptsExceeded => "MaxDeliveryAttemptsExceeded",
            Self::TimeToLiveExceeded => "TimeToLiveExceeded",
            Self::DeliveryRefused => "DeliveryRefused",
            Self::QueueFull => "QueueFull",
        }
    }
}
