//! Lock types: each is a thin [`Driver`](crate::engine::Driver) (its scripts and wake rule)
//! plus a public handle; waiting, renewal and release are shared (see [`crate::engine`] and
//! [`crate::lease`]).

pub(crate) mod guard;
pub(crate) mod mutex;

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::config::{check_duration, MAX_DURATION};
use crate::engine::{acquire, Driver, Patience};
use crate::error::Result;
use crate::lease::Lease;
use crate::lock::guard::LockGuard;
use crate::owner::Owner;

/// What every lock handle carries: the driver, an optional fixed owner and an optional lease.
pub(crate) struct Acquirer<D: Driver> {
    pub(crate) driver: Arc<D>,
    owner: Option<Owner>,
    lease: Option<Lease>,
}

impl<D: Driver> Clone for Acquirer<D> {
    fn clone(&self) -> Self {
        Acquirer {
            driver: self.driver.clone(),
            owner: self.owner.clone(),
            lease: self.lease,
        }
    }
}

impl<D: Driver> Acquirer<D> {
    pub(crate) fn new(driver: D) -> Self {
        Acquirer {
            driver: Arc::new(driver),
            owner: None,
            lease: None,
        }
    }

    pub(crate) fn with_owner(mut self, owner: &Owner) -> Self {
        self.owner = Some(owner.clone());
        self
    }

    pub(crate) fn with_lease(mut self, lease: Lease) -> Result<Self> {
        lease.validate()?;
        self.lease = Some(lease);
        Ok(self)
    }

    pub(crate) fn owner(&self) -> Option<&Owner> {
        self.owner.as_ref()
    }

    fn lease(&self) -> Lease {
        self.lease
            .unwrap_or_else(|| Lease::watchdog(self.driver.client().config().watchdog_lease))
    }

    pub(crate) async fn acquire(&self, patience: Patience) -> Result<Option<LockGuard>> {
        let owner = self.owner.clone().unwrap_or_default();
        acquire(self.driver.clone(), owner, self.lease(), patience).await
    }

    pub(crate) async fn wait_forever(&self) -> Result<LockGuard> {
        match self.acquire(Patience::Forever).await? {
            Some(guard) => Ok(guard),
            None => Err(crate::Error::Shutdown),
        }
    }

    pub(crate) async fn wait_for(&self, timeout: Duration) -> Result<Option<LockGuard>> {
        if !timeout.is_zero() {
            check_duration("timeout", timeout, Duration::from_nanos(1))?;
        }
        let deadline = Instant::now() + timeout.min(MAX_DURATION);
        let patience = if timeout.is_zero() {
            Patience::None
        } else {
            Patience::Until(deadline)
        };
        self.acquire(patience).await
    }
}
