//! Leader election on Choria Streams (JetStream KV bucket `CHORIA_LEADER_ELECTION`).
