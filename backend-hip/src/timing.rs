//! Device-side timing with a pair of HIP events.

use crate::context::Context;
use crate::result::check;
use crate::sys::HipEvent;
use calico_core::Result;

/// A HIP event destroyed on drop.
struct Event<'a> {
    ctx: &'a Context,
    raw: HipEvent,
}

impl<'a> Event<'a> {
    fn new(ctx: &'a Context) -> Result<Self> {
        let mut raw: HipEvent = std::ptr::null_mut();
        // SAFETY: `raw` is a live out-pointer.
        let code = unsafe { (ctx.rt.hip.hipEventCreate)(&mut raw) };
        check(&ctx.rt.hip, code, "hipEventCreate")?;
        Ok(Event { ctx, raw })
    }

    fn record(&self) -> Result<()> {
        // SAFETY: event and stream are alive and belong to the same device.
        let code = unsafe { (self.ctx.rt.hip.hipEventRecord)(self.raw, self.ctx.stream()) };
        check(&self.ctx.rt.hip, code, "hipEventRecord")
    }
}

impl Drop for Event<'_> {
    fn drop(&mut self) {
        // SAFETY: we created the event; destroying a recorded event is allowed.
        unsafe { (self.ctx.rt.hip.hipEventDestroy)(self.raw) };
    }
}

/// Runs `work` between two events on the device's stream and returns the elapsed ms.
pub(crate) fn time_ms(ctx: &Context, work: &mut dyn FnMut() -> Result<()>) -> Result<f64> {
    ctx.bind()?;
    let start = Event::new(ctx)?;
    let stop = Event::new(ctx)?;
    start.record()?;
    work()?;
    ctx.bind()?;
    stop.record()?;
    let hip = &ctx.rt.hip;
    // SAFETY: `stop` was recorded on our stream.
    let code = unsafe { (hip.hipEventSynchronize)(stop.raw) };
    check(hip, code, "hipEventSynchronize")?;
    let mut ms = 0.0f32;
    // SAFETY: both events were recorded and `stop` has completed; `ms` is a live out-pointer.
    let code = unsafe { (hip.hipEventElapsedTime)(&mut ms, start.raw, stop.raw) };
    check(hip, code, "hipEventElapsedTime")?;
    Ok(f64::from(ms))
}
