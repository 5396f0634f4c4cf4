//! The user-kernel example (examples/tile_softmax.cu) through the public `TileKernel` API on
//! the GPU found, against an f64 softmax; reported skipped with no GPU (the offline compile
//! for all four targets is in compile_all.rs).

use calico::tile_kernel::TileKernel;
use calico::{DType, Device, KernelArg, LaunchConfig};
use half::bf16;

#[test]
fn tile_softmax_example_matches_the_reference_on_the_gpu() {
    let dev = Device::auto().expect("a device (the CPU at least)");
    if dev.as_gpu().is_none() {
        println!("skipped: no CUDA or HIP device");
        return;
    }
    const COLS: usize = 64;
    let kernel = TileKernel::new("tile_softmax", include_str!("../examples/tile_softmax.cu"))
        .define("COLS", COLS);
    for rows in [1, 16, 100] {
        let scale = 0.125f32;
        let host: Vec<bf16> = (0..rows * COLS)
            .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 10.0))
            .collect();
        let x = dev.tensor(&host, &[rows, COLS]).unwrap();
        let y = dev.zeros(&[rows, COLS], DType::F32).unwrap();
        let config = LaunchConfig::linear(rows.div_ceil(16) as u32, dev.arch().lanes, 0);
        let args = [
            KernelArg::Ptr(x.device_ptr().unwrap()),
            KernelArg::Ptr(y.device_ptr().unwrap()),
            KernelArg::I32(rows as i32),
            KernelArg::F32(scale * std::f32::consts::LOG2_E),
        ];
        // Twice: the second launch finds the loaded kernel by the TileKernel value.
        kernel.launch(&dev, &config, &args).unwrap();
        kernel.launch(&dev, &config, &args).unwrap();
        let got: Vec<f32> = y.to_vec().unwrap();
        for r in 0..rows {
            let row: Vec<f64> = (0..COLS)
                .map(|c| f64::from(host[r * COLS + c].to_f32()) * f64::from(scale))
                .collect();
            let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
            for c in 0..COLS {
                let want = (row[c] - max).exp() / sum;
                let g = f64::from(got[r * COLS + c]);
                assert!(
                    (g - want).abs() <= 1e-5,
                    "rows {rows}: y[{r}][{c}] = {g}, want {want}"
                );
            }
        }
        println!("tile_softmax {rows} rows on {}: ok", dev.arch().target);
    }
}
