//! Calico ops recorded into a CUDA or HIP graph replay to the eager results: a decode step
//! (add_rms_norm, three matmuls, rope, softmax) is captured once and replayed 100 times.

use calico::backends::cuda::{cudarc, CapturedGraph, CudaDevice};
use calico::backends::hip::{sys as hip_sys, HipDevice};
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

fn capture_and_replay(tokens: usize, hidden: usize, kv_heads: usize) {
    let Some(cuda) = cuda() else { return };
    let dev = Device::Cuda(cuda.clone());
    let mut rng = XorShift::new(0x9a11);
    let mut step = DecodeStep::new(&dev, &mut rng, tokens, hidden, kv_heads).unwrap();
    // Eager: the reference, and the warm-up that compiles and loads every kernel.
    step.run(&dev).unwrap();
    let eager = step.outputs().unwrap();
    assert!(eager.iter().flatten().all(|v| v.is_finite()));

    step.poison_outputs().unwrap();
    let loaded = cuda.loaded_kernels();
    let graph = cuda.capture_graph(|| step.run(&dev)).unwrap();
    assert_eq!(cuda.loaded_kernels(), loaded, "capture compiled a kernel");
    // Capturing queued nothing: the outputs still hold the poison.
    assert!(step.outputs().unwrap()[0].iter().all(|v| v.is_nan()));
    // Only kernel launches were recorded: no allocation, copy, memset or host node.
    let types = node_types(&graph);
    // At least one node per op (an op may launch more than one kernel).
    assert!(types.len() >= 7, "fewer nodes than ops: {types:?}");
    assert!(types
        .iter()
        .all(|t| *t == sys::CUgraphNodeType::CU_GRAPH_NODE_TYPE_KERNEL));

    for _ in 0..100 {
        graph.launch().unwrap();
    }
    let replayed = step.outputs().unwrap();
    for (i, (r, e)) in replayed.iter().zip(&eager).enumerate() {
        // Same kernels on the same inputs: bit-identical.
        let same = r.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "output {i} differs between replay and eager");
    }
}

#[test]
fn a_captured_decode_step_replays_to_the_eager_results() {
    capture_and_replay(8, 1024, 2);
}

#[test]
fn a_captured_decode_step_of_a_7b_model_replays_to_the_eager_results() {
    capture_and_replay(16, 4096, 8);
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

/// The HIP side of `capture_and_replay`: the same step, recorded with hipStreamBeginCapture.
fn capture_and_replay_hip(tokens: usize, hidden: usize, kv_heads: usize) {
    let Some(hip) = hip() else { return };
    let dev = Device::Hip(hip.clone());
    let mut rng = XorShift::new(0x9a11);
    let mut step = DecodeStep::new(&dev, &mut rng, tokens, hidden, kv_heads).unwrap();
    step.run(&dev).unwrap();
    let eager = step.outputs().unwrap();
    assert!(eager.iter().flatten().all(|v| v.is_finite()));

    step.poison_outputs().unwrap();
    let loaded = hip.loaded_kernels();
    let graph = hip.capture_graph(|| step.run(&dev)).unwrap();
    assert_eq!(hip.loaded_kernels(), loaded, "capture compiled a kernel");
    assert!(step.outputs().unwrap()[0].iter().all(|v| v.is_nan()));
    let types = graph.node_types().unwrap();
    assert!(types.len() >= 7, "fewer nodes than ops: {types:?}");
    assert!(types
        .iter()
        .all(|&t| t == hip_sys::HIP_GRAPH_NODE_TYPE_KERNEL));

    for _ in 0..100 {
        graph.launch().unwrap();
    }
    let replayed = step.outputs().unwrap();
    for (i, (r, e)) in replayed.iter().zip(&eager).enumerate() {
        let same = r.iter().zip(e).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "output {i} differs between replay and eager (HIP)");
    }
}

#[test]
fn a_captured_decode_step_replays_to_the_eager_results_on_hip() {
    capture_and_replay_hip(8, 1024, 2);
    capture_and_replay_hip(16, 4096, 8);
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
