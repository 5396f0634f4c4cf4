//! Stream capture into HIP graphs: the AMD side of `CudaDevice::capture_graph`. Ops queued on
//! a device's stream while it captures are recorded instead of run; the instantiated graph is
//! then replayed with one launch per step.

use crate::context::{Context, Handle};
use crate::result::check;
use crate::sys::{self, HipGraph, HipGraphExec, HipGraphFns, HipGraphNode};
use calico_core::{Error, Result};
use std::ffi::c_int;
use std::sync::Arc;

/// Ops recorded by `HipDevice::capture_graph`, instantiated and ready to replay.
#[derive(Debug)]
pub struct CapturedHipGraph {
    ctx: Arc<Context>,
    graph: Handle,
    exec: Handle,
}

/// The graph entry points, or why this runtime has none.
fn graph_fns(ctx: &Context) -> Result<&HipGraphFns> {
    ctx.rt.graph.as_ref().map_err(|why| {
        Error::unsupported(format!(
            "the HIP runtime {} cannot capture graphs: {why}",
            ctx.rt.hip_path
        ))
    })
}

/// Records what `work` queues on `ctx`'s stream (thread-local capture mode: other threads may
/// keep working) and instantiates it. The capture is ended whatever `work` returns, so the
/// stream is usable again; `work`'s error wins over the runtime's.
pub fn capture(ctx: &Arc<Context>, work: impl FnOnce() -> Result<()>) -> Result<CapturedHipGraph> {
    let g = graph_fns(ctx)?;
    let hip = &ctx.rt.hip;
    ctx.bind()?;
    let stream = ctx.stream();
    // SAFETY: the stream is alive for as long as `ctx`; the mode is a valid enum value.
    let code =
        unsafe { (g.hipStreamBeginCapture)(stream, sys::HIP_STREAM_CAPTURE_MODE_THREAD_LOCAL) };
    check(hip, code, "hipStreamBeginCapture")?;
    let outcome = work();
    let mut graph: HipGraph = std::ptr::null_mut();
    // SAFETY: the stream is capturing (begun above); `graph` is a live out-pointer.
    let ended = check(
        hip,
        unsafe { (g.hipStreamEndCapture)(stream, &mut graph) },
        "hipStreamEndCapture",
    );
    let destroy = |graph: HipGraph| {
        if !graph.is_null() {
            // SAFETY: the graph was returned by hipStreamEndCapture and is not used again.
            unsafe { (g.hipGraphDestroy)(graph) };
        }
    };
    if let Err(e) = outcome.and(ended) {
        destroy(graph);
        return Err(e);
    }
    if graph.is_null() {
        return Err(Error::Runtime {
            backend: "hip",
            call: "hipStreamEndCapture".into(),
            message: "the capture recorded no work".into(),
        });
    }
    let mut exec: HipGraphExec = std::ptr::null_mut();
    // SAFETY: `graph` is a live graph; no error node or log buffer is asked for.
    let code = unsafe {
        (g.hipGraphInstantiate)(
            &mut exec,
            graph,
            std::ptr::null_mut(),
            std::ptr::null_mut(),
            0,
        )
    };
    if let Err(e) = check(hip, code, "hipGraphInstantiate") {
        destroy(graph);
        return Err(e);
    }
    Ok(CapturedHipGraph {
        ctx: ctx.clone(),
        graph: Handle(graph),
        exec: Handle(exec),
    })
}

impl CapturedHipGraph {
    /// Queues one replay on the stream the graph was captured on (no synchronisation): the
    /// recorded ops run again on the same buffers.
    pub fn launch(&self) -> Result<()> {
        let g = graph_fns(&self.ctx)?;
        self.ctx.bind()?;
        // SAFETY: the executable graph and the stream live as long as `self`.
        let code = unsafe { (g.hipGraphLaunch)(self.exec.0, self.ctx.stream()) };
        check(&self.ctx.rt.hip, code, "hipGraphLaunch")
    }

    /// The type of each node of the recorded graph (`sys::HIP_GRAPH_NODE_TYPE_KERNEL` for a
    /// kernel launch), in the runtime's order.
    pub fn node_types(&self) -> Result<Vec<c_int>> {
        let g = graph_fns(&self.ctx)?;
        let hip = &self.ctx.rt.hip;
        let mut count = 0usize;
        // SAFETY: a live graph; a null node array asks for the count only.
        let code = unsafe { (g.hipGraphGetNodes)(self.graph.0, std::ptr::null_mut(), &mut count) };
        check(hip, code, "hipGraphGetNodes")?;
        let mut nodes: Vec<HipGraphNode> = vec![std::ptr::null_mut(); count];
        // SAFETY: `nodes` has room for `count` handles.
        let code = unsafe { (g.hipGraphGetNodes)(self.graph.0, nodes.as_mut_ptr(), &mut count) };
        check(hip, code, "hipGraphGetNodes")?;
        nodes.truncate(count);
        nodes
            .iter()
            .map(|&node| {
                let mut kind: c_int = -1;
                // SAFETY: `node` belongs to the live graph; `kind` is a live out-pointer.
                let code = unsafe { (g.hipGraphNodeGetType)(node, &mut kind) };
                check(hip, code, "hipGraphNodeGetType").map(|()| kind)
            })
            .collect()
    }
}

impl Drop for CapturedHipGraph {
    fn drop(&mut self) {
        if let Ok(g) = graph_fns(&self.ctx) {
            let _ = self.ctx.bind();
            // SAFETY: both handles are ours and used by nothing else after this; replays
            // already queued keep their own reference in the runtime. Errors at teardown
            // have nowhere to go.
            unsafe {
                (g.hipGraphExecDestroy)(self.exec.0);
                (g.hipGraphDestroy)(self.graph.0);
            }
        }
    }
}
