//! Runs the user tile kernel in tile_softmax.cu on the GPU found (CUDA or HIP) and checks it
//! against a CPU computation; with no GPU, compiles it for sm_80, sm_90a, gfx90a and gfx942
//! where the compilers are installed. `cargo run -p calico --example tile_softmax`.

use calico::tile_kernel::TileKernel;
use calico::{DType, Device, Error, KernelArg, LaunchConfig, Result};
use half::bf16;

const SOURCE: &str = include_str!("tile_softmax.cu");
const COLS: usize = 64;

fn main() -> Result<()> {
    let kernel = TileKernel::new("tile_softmax", SOURCE).define("COLS", COLS);
    let dev = Device::auto()?;
    if dev.as_gpu().is_none() {
        println!("no GPU: compiling tile_softmax for each target instead");
        for target in ["sm_80", "sm_90a", "gfx90a", "gfx942"] {
            match kernel.compile_for(target) {
                Ok(binary) => println!("{target}: {} bytes", binary.len()),
                Err(Error::BackendUnavailable { reason, .. }) => {
                    println!("{target}: skipped ({reason})")
                }
                Err(e) => return Err(e),
            }
        }
        return Ok(());
    }

    let rows = 100; // not a multiple of 16: the last tile is partial
    let scale = 0.125f32;
    let host: Vec<bf16> = (0..rows * COLS)
        .map(|i| bf16::from_f32(((i * 37 % 101) as f32 - 50.0) / 10.0))
        .collect();
    let x = dev.tensor(&host, &[rows, COLS])?;
    let y = dev.zeros(&[rows, COLS], DType::F32)?;
    let ptr = |t: &calico::Tensor| {
        t.device_ptr()
            .map(KernelArg::Ptr)
            .ok_or_else(|| Error::unsupported("a GPU tensor has a device pointer"))
    };
    let config = LaunchConfig::linear(rows.div_ceil(16) as u32, dev.arch().lanes, 0);
    let args = [
        ptr(&x)?,
        ptr(&y)?,
        KernelArg::I32(rows as i32),
        KernelArg::F32(scale * std::f32::consts::LOG2_E),
    ];
    kernel.launch(&dev, &config, &args)?;
    let got: Vec<f32> = y.to_vec()?;

    let mut worst = 0.0f64;
    for r in 0..rows {
        let row: Vec<f64> = (0..COLS)
            .map(|c| f64::from(host[r * COLS + c].to_f32()) * f64::from(scale))
            .collect();
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let sum: f64 = row.iter().map(|v| (v - max).exp()).sum();
        for c in 0..COLS {
            let want = (row[c] - max).exp() / sum;
            worst = worst.max((f64::from(got[r * COLS + c]) - want).abs());
        }
    }
    println!(
        "tile_softmax on {}: max abs error {worst:.2e}",
        dev.arch().target
    );
    if worst > 1e-5 {
        return Err(Error::unsupported(format!("error {worst} exceeds 1e-5")));
    }
    Ok(())
}
