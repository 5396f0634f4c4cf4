//! Calico ops recorded into a CUDA or HIP graph replay to the eager results: a decode step
//! (add_rms_norm, three matmuls, rope, softmax) is captured once and replayed 100 times.

use calico::backends::cuda::{cudarc, CapturedGraph, CudaDevice};
use calico::backends::hip::{sys as hip_sys, CapturedHipGraph, HipDevice};
use calico::Device;
use calico_benches::cases::decode_step::DecodeStep;
use calico_benches::rng::XorShift;
use cudarc::driver::sys;

fn cuda() -> Option<CudaDevice> {
    match CudaDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("skipped backend cuda: {e}");
            None
        }
    }
}

/// The types of the nodes of a captured graph.
fn node_types(graph: &CapturedGraph) -> Vec<sys::CUgraphNodeType> {
    let g = graph.as_cudarc().cu_graph();
    let mut count = 0usize;
    // SAFETY: `g` is a live graph; a null node array asks only for the count.
    unsafe { sys::cuGraphGetNodes(g, std::ptr::null_mut(), &mut count) }
        .result()
        .expect("cuGraphGetNodes (count)");
    let mut nodes = vec![std::ptr::null_mut(); count];
    // SAFETY: `nodes` has room for `count` handles.
    unsafe { sys::cuGraphGetNodes(g, nodes.as_mut_ptr(), &mut count) }
        .result()
        .expect("cuGraphGetNodes");
    nodes
        .iter()
        .map(|&n| {
            let mut t = sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_EMPTY;
            // SAFETY: `n` is a node of the live graph; `t` is a valid out-pointer.
            unsafe { sys::cuGraphNodeGetType(n, &mut t) }
                .result()
                .expect("cuGraphNodeGetType");
            t
        })
        .collect()
}

/// What the replay check needs from a backend's graph capture.
trait Recorder {
    type Graph;
    fn device(&self) -> Device;
    fn loaded_kernels(&self) -> usize;
    fn capture(&self, step: &mut DecodeStep, dev: &Device) -> Self::Graph;
    /// Each node of the graph: whether it is a kernel launch, and its type for messages.
    fn nodes(&self, graph: &Self::Graph) -> Vec<(bool, String)>;
    fn launch(&self, graph: &Self::Graph);
}

impl Recorder for CudaDevice {
    type Graph = CapturedGraph;
    fn device(&self) -> Device {
        Device::Cuda(self.clone())
    }
    fn loaded_kernels(&self) -> usize {
        CudaDevice::loaded_kernels(self)
    }
    fn capture(&self, step: &mut DecodeStep, dev: &Device) -> CapturedGraph {
        self.capture_graph(|| step.run(dev)).unwrap()
    }
    fn nodes(&self, graph: &CapturedGraph) -> Vec<(bool, String)> {
        node_types(graph)
            .into_iter()
            .map(|t| {
                (
                    t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL,
                    format!("{t:?}"),
                )
            })
            .collect()
    }
    fn launch(&self, graph: &CapturedGraph) {
        graph.launch().unwrap();
    }
}

impl Recorder for HipDevice {
    type Graph = CapturedHipGraph;
    fn device(&self) -> Device {
        Device::Hip(self.clone())
    }
    fn loaded_kernels(&self) -> usize {
        HipDevice::loaded_kernels(self)
    }
    fn capture(&self, step: &mut DecodeStep, dev: &Device) -> CapturedHipGraph {
        self.capture_graph(|| step.run(dev)).unwrap()
    }
    fn nodes(&self, graph: &CapturedHipGraph) -> Vec<(bool, String)> {
        graph
            .node_types()
            .unwrap()
            .into_iter()
            .map(|t| {
                (
                    t == hip_sys::HIP_GRAPH_NODE_TYPE_KERNEL,
                    format!("hipGraphNodeType {t}"),
                )
            })
            .collect()
    }
    fn launch(&self, graph: &CapturedHipGraph) {
        graph.launch().unwrap();
    }
}

fn capture_and_replay<R: Recorder>(gpu: &R, tokens: usize, hidden: usize, kv_heads: usize) {
    let dev = gpu.device();
    let mut rng = XorShift::new(0x9a11);
    let mut step = DecodeStep::new(&dev, &mut rng, tokens, hidden, kv_heads).unwrap();
    // Eager: the reference, and the warm-up that compiles and loads every kernel.
    step.run(&dev).unwrap();
    let eager = step.outputs().unwrap();
    assert!(eager.iter().flatten().all(|v| v.is_finite()));

    step.poison_outputs().unwrap();
    let loaded = gpu.loaded_kernels();
    let graph = gpu.capture(&mut step, &dev);
    assert_eq!(gpu.loaded_kernels(), loaded, "capture compiled a kernel");
    // Capturing queued nothing: the outputs still hold the poison.
    assert!(step.outputs().unwrap()[0].iter().all(|v| v.is_nan()));
    // Only kernel launches were recorded: no allocation, copy, memset or host node.
    let nodes = gpu.nodes(&graph);
    // At least one node per op (an op may launch more than one kernel).
    assert!(nodes.len() >= 7, "fewer nodes than ops: {nodes:?}");
    assert!(nodes.iter().all(|(kernel, _)| *kernel), "{nodes:?}");

    for _ in 0..100 {
        gpu.launch(&graph);
    }
    let replayed = step.outputs().unwrap();
    for (i, (r, e)) in replayed.iter().zip(&eager).enumerate() {
        // Same kernels on the same inputs: bit-identical.
        let same = r.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(
            same,
            "output {i} differs between replay and eager on {}",
            dev.kind()
        );
    }
}

#[test]
fn a_captured_decode_step_replays_to_the_eager_results() {
    let Some(cuda) = cuda() else { return };
    capture_and_replay(&cuda, 8, 1024, 2);
}

#[test]
fn a_captured_decode_step_of_a_7b_model_replays_to_the_eager_results() {
    let Some(cuda) = cuda() else { return };
    capture_and_replay(&cuda, 16, 4096, 8);
}

#[test]
fn ops_queue_on_a_users_cudarc_stream() {
    let Some(cuda) = cuda() else { return };
    let stream = cuda.context().new_stream().unwrap();
    let mine = cuda.with_stream(stream.clone()).unwrap();
    assert!(std::sync::Arc::ptr_eq(mine.stream(), &stream));
    let dev = Device::Cuda(mine.clone());
    let mut rng = XorShift::new(5);
    let mut step = DecodeStep::new(&dev, &mut rng, 4, 1024, 2).unwrap();
    step.run(&dev).unwrap();
    let first = step.outputs().unwrap();
    step.poison_outputs().unwrap();
    // Captured on the user's stream, replayed there.
    let graph = mine.capture_graph(|| step.run(&dev)).unwrap();
    graph.launch().unwrap();
    stream.synchronize().unwrap();
    assert_eq!(step.outputs().unwrap(), first);
}

fn hip() -> Option<HipDevice> {
    match HipDevice::new(0) {
        Ok(d) => Some(d),
        Err(e) => {
            println!("skipped backend hip: {e}");
            None
        }
    }
}

#[test]
fn a_captured_decode_step_replays_to_the_eager_results_on_hip() {
    let Some(hip) = hip() else { return };
    capture_and_replay(&hip, 8, 1024, 2);
    capture_and_replay(&hip, 16, 4096, 8);
}

#[test]
fn ops_queue_on_a_users_hip_stream() {
    let Some(hip) = hip() else { return };
    let stream = hip.create_stream().unwrap();
    // SAFETY: `stream` was created on this device and outlives `mine` and its tensors (both
    // are dropped at the end of this test, before `stream`).
    let mine = unsafe { hip.with_stream(stream.raw()) }.unwrap();
    assert_eq!(mine.stream(), stream.raw());
    let dev = Device::Hip(mine.clone());
    let mut rng = XorShift::new(5);
    let mut step = DecodeStep::new(&dev, &mut rng, 4, 1024, 2).unwrap();
    step.run(&dev).unwrap();
    let first = step.outputs().unwrap();
    step.poison_outputs().unwrap();
    let graph = mine.capture_graph(|| step.run(&dev)).unwrap();
    graph.launch().unwrap();
    dev.synchronize().unwrap();
    assert_eq!(step.outputs().unwrap(), first);
    drop((graph, step, dev, mine));
}
