//! The nonce proofs of the nodes being identified at the same moment, checked together.
//!
//! Each node's `gen25519` reply is checked by the cycle that asked for it. The first cycle to
//! arrive with a proof leads: it lets every other ready task run once (a yield), takes the
//! proofs queued meanwhile and checks them as one batch
//! ([`choria_crypto::nonce::verify_nonce_signatures`]), about half the cost of checking them one
//! at a time once a few are waiting. Each cycle gets exactly the answer a check of its proof alone
//! gives. Nothing runs in the background: a leader cancelled before its batch is checked checks it
//! as it is dropped, so no cycle waits on a proof nobody checks.

use std::sync::{Mutex, PoisonError};

use choria_crypto::nonce::{
    verify_nonce_signature, verify_nonce_signatures, NonceError, NonceProof,
};
use tokio::sync::oneshot;

/// The most proofs checked in one multiscalar multiplication; more waiting are checked in
/// batches of this size. The cost a proof falls little past it and a failed batch re-checks at
/// most this many proofs one by one.
const MAX_BATCH: usize = 64;

struct Pending {
    nonce: String,
    public_key: String,
    signature: String,
    answer: oneshot::Sender<Result<(), NonceError>>,
}

/// The queue of proofs waiting for their batch.
#[derive(Default)]
pub(crate) struct NonceChecks {
    queue: Mutex<Vec<Pending>>,
    /// How many batches were checked, for the tests.
    #[cfg(test)]
    batches: std::sync::atomic::AtomicUsize,
}

impl NonceChecks {
    /// Checks one node's proof with whatever others arrive in the same turn of the runtime.
    pub(crate) async fn verify(
        &self,
        nonce: &str,
        public_key: &str,
        signature: &str,
    ) -> Result<(), NonceError> {
        let (tx, rx) = oneshot::channel();
        let lead = {
            let mut q = self.queue.lock().unwrap_or_else(PoisonError::into_inner);
            q.push(Pending {
                nonce: nonce.to_owned(),
                public_key: public_key.to_owned(),
                signature: signature.to_owned(),
                answer: tx,
            });
            q.len() == 1
        };
        if lead {
            let leader = Leader(self);
            tokio::task::yield_now().await;
            drop(leader);
        }
        match rx.await {
            Ok(answer) => answer,
            // Only a panic inside a check drops an answer; check this proof alone.
            Err(_) => verify_nonce_signature(nonce, public_key, signature),
        }
    }

    fn check_queued(&self) {
        let batch = std::mem::take(&mut *self.queue.lock().unwrap_or_else(PoisonError::into_inner));
        let mut batch = batch.into_iter().peekable();
        while batch.peek().is_some() {
            let chunk: Vec<Pending> = batch.by_ref().take(MAX_BATCH).collect();
            let proofs: Vec<NonceProof<'_>> = chunk
                .iter()
                .map(|p| NonceProof {
                    nonce: &p.nonce,
                    public_key_hex: &p.public_key,
                    signature_hex: &p.signature,
                })
                .collect();
            let answers = verify_nonce_signatures(&proofs);
            #[cfg(test)]
            self.batches
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            drop(proofs);
            for (p, answer) in chunk.into_iter().zip(answers) {
                // A cycle that has gone away does not want its answer.
                let _ = p.answer.send(answer);
            }
        }
    }
}

/// Checks the queue when the leading cycle is done waiting, or is dropped while it waits.
struct Leader<'a>(&'a NonceChecks);

impl Drop for Leader<'_> {
    fn drop(&mut self) {
        self.0.check_queued();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use choria_crypto::nonce::sign_nonce;
    use std::sync::Arc;

    fn proofs(n: u8) -> Vec<(String, String, String)> {
        (0..n)
            .map(|i| {
                let key = ed25519_dalek::SigningKey::from_bytes(&[i + 1; 32]);
                let nonce = format!("n{i}");
                let (pk, sig) = sign_nonce(&key, nonce.as_bytes());
                (nonce, pk, sig)
            })
            .collect()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn concurrent_cycles_are_checked_in_one_batch_each_with_its_own_answer() {
        let checks = Arc::new(NonceChecks::default());
        let mut all = proofs(20);
        // The seventh presents the eighth's signature.
        all[6].2 = all[7].2.clone();
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (n, pk, sig)) in all.into_iter().enumerate() {
            let checks = checks.clone();
            tasks.spawn(async move { (i, checks.verify(&n, &pk, &sig).await) });
        }
        let mut answers = vec![None; 20];
        while let Some(r) = tasks.join_next().await {
            let (i, answer) = r.unwrap();
            answers[i] = Some(answer);
        }
        for (i, a) in answers.into_iter().enumerate() {
            let a = a.unwrap();
            if i == 6 {
                assert_eq!(a, Err(NonceError::BadSignature));
            } else {
                assert_eq!(a, Ok(()), "proof {i}");
            }
        }
        assert!(checks.queue.lock().unwrap().is_empty());
        assert_eq!(
            checks.batches.load(std::sync::atomic::Ordering::Relaxed),
            1,
            "twenty cycles ready at once make one batch"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn cycles_on_several_threads_each_get_their_own_answer() {
        let checks = Arc::new(NonceChecks::default());
        let mut all = proofs(60);
        for i in (0..60).step_by(7) {
            all[i].0 = format!("not-{}", all[i].0);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for (i, (n, pk, sig)) in all.into_iter().enumerate() {
            let checks = checks.clone();
            tasks.spawn(async move { (i, checks.verify(&n, &pk, &sig).await) });
        }
        let mut seen = 0;
        while let Some(r) = tasks.join_next().await {
            let (i, answer) = r.unwrap();
            let want = if i % 7 == 0 {
                Err(NonceError::BadSignature)
            } else {
                Ok(())
            };
            assert_eq!(answer, want, "proof {i}");
            seen += 1;
        }
        assert_eq!(seen, 60);
        assert!(checks.queue.lock().unwrap().is_empty());
    }

    #[tokio::test(flavor = "current_thread")]
    async fn a_leader_cancelled_while_it_waits_still_answers_the_others() {
        let checks = Arc::new(NonceChecks::default());
        let all = proofs(3);
        let (n0, pk0, sig0) = all[0].clone();
        // The leader queues its proof and is dropped at its yield.
        {
            let mut lead = Box::pin(checks.verify(&n0, &pk0, &sig0));
            let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
            assert!(lead.as_mut().poll(&mut cx).is_pending());
            // A follower queues behind it before the leader goes away.
            let (n1, pk1, sig1) = all[1].clone();
            let checks2 = checks.clone();
            let follower = tokio::spawn(async move { checks2.verify(&n1, &pk1, &sig1).await });
            tokio::task::yield_now().await;
            assert_eq!(checks.queue.lock().unwrap().len(), 2);
            drop(lead);
            assert!(checks.queue.lock().unwrap().is_empty());
            assert_eq!(follower.await.unwrap(), Ok(()));
        }
        let (n2, pk2, sig2) = all[2].clone();
        assert_eq!(checks.verify(&n2, &pk2, &sig2).await, Ok(()));
        assert_eq!(
            checks.verify(&n2, &pk2, &all[1].2).await,
            Err(NonceError::BadSignature)
        );
    }

    use std::future::Future as _;
}
