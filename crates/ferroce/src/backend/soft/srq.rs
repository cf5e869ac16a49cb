//! A soft shared receive queue: a pool of receives in the engine that many QPs take from.

use std::sync::Arc;

use ferroce_proto::memory::PdId;
use ferroce_proto::qp::{PostError, RecvWr, SrqId};
use ferroce_proto::{SrqAttr, SrqError};

use super::driver::Driver;

/// A soft SRQ; destroyed in the engine with its last handle (every QP on it holds one).
pub(crate) struct Srq {
    id: SrqId,
    driver: Arc<Driver>,
}

impl Srq {
    pub(super) fn new(driver: &Arc<Driver>, pd: PdId, max_wr: u32) -> Self {
        let id = driver.lock().engine.create_srq(pd, max_wr);
        Self {
            id,
            driver: Arc::clone(driver),
        }
    }

    pub(crate) fn id(&self) -> SrqId {
        self.id
    }

    pub(crate) fn post_recv(&self, wr: RecvWr) -> Result<(), PostError> {
        let (mut state, now, _) = self.driver.enter();
        state.engine.post_srq_recv(self.id, wr)?;
        self.driver.after_command_at(state, now);
        Ok(())
    }

    pub(crate) fn modify(&self, max_wr: Option<u32>, limit: Option<u32>) -> Result<(), SrqError> {
        self.driver.lock().engine.modify_srq(self.id, max_wr, limit)
    }

    pub(crate) fn query(&self) -> Option<SrqAttr> {
        self.driver.lock().engine.query_srq(self.id)
    }
}

impl Drop for Srq {
    fn drop(&mut self) {
        // Every queue pair on it holds a handle, so none is left to make this fail.
        let _ = self.driver.lock().engine.destroy_srq(self.id);
    }
}
