//! The vendor baseline: cuBLASLt bf16 GEMM through cudarc's result layer, on Calico's own
//! stream and buffers, so both are timed by the same events on the same queue.
//!
//! Descriptors and the heuristic's algorithm are chosen once per shape, outside the timing, as
//! torch does after its first call. cudarc panics when libcublasLt is missing, so the library is
//! probed first.

use calico::backends::cuda::{probe, CudaDevice};
use calico::{DType, Device, Tensor};
use cudarc::cublaslt::{result, sys};
use std::ffi::c_void;
use std::path::{Path, PathBuf};

/// cuBLASLt's workspace: 32 MiB, NVIDIA's recommendation for Hopper.
const WORKSPACE_BYTES: usize = 32 << 20;

/// A cuBLASLt handle bound to one Calico CUDA device.
#[derive(Debug)]
pub struct CublasLt {
    handle: sys::cublasLtHandle_t,
    /// Where the library was found when it was not on the loader path.
    pub source: Option<PathBuf>,
    device: calico::DeviceId,
    workspace: Tensor,
    stream: sys::cudaStream_t,
}

impl CublasLt {
    /// `Ok(None)` on devices other than CUDA; `Err` (with the reason) when the library is
    /// missing or fails to start.
    pub fn new(dev: &Device) -> Result<Option<CublasLt>, String> {
        let Device::Cuda(cuda) = dev else {
            return Ok(None);
        };
        let source = find_library()?;
        bind(cuda)?;
        let workspace = dev
            .zeros(&[WORKSPACE_BYTES / 2], DType::BF16)
            .map_err(|e| format!("cuBLASLt workspace: {e}"))?;
        let handle = result::create_handle().map_err(|e| format!("cublasLtCreate: {e}"))?;
        Ok(Some(CublasLt {
            handle,
            source,
            device: dev.device_id(),
            workspace,
            stream: cuda.cu_stream() as sys::cudaStream_t,
        }))
    }

    /// Plans `D[M,N] = A[M,K] · W[N,K]^T` with row-major bf16 A, W and D, f32 accumulation.
    ///
    /// cuBLASLt is column-major: a row-major X is X^T in its eyes, so it computes
    /// D^T (N x M) = op(W^T as K x N) · A^T (K x M) with op = transpose: the "TN" GEMM of
    /// torch Linear.
    pub fn plan(&self, m: usize, n: usize, k: usize) -> Result<LtGemm<'_>, String> {
        let lt = |what: &str, e: result::CublasError| format!("{what}: {e}");
        let bf16 = sys::cudaDataType_t::CUDA_R_16BF;
        let (m64, n64, k64) = (m as u64, n as u64, k as u64);
        let mut g = LtGemm {
            lt: self,
            shape: (m, n, k),
            desc: std::ptr::null_mut(),
            layouts: [std::ptr::null_mut(); 3],
            algo: None,
        };
        g.desc = result::create_matmul_desc(
            sys::cublasComputeType_t::CUBLAS_COMPUTE_32F,
            sys::cudaDataType_t::CUDA_R_32F,
        )
        .map_err(|e| lt("cublasLtMatmulDescCreate", e))?;
        let (op_t, op_n): (i32, i32) = (1, 0);
        for (attr, op) in [
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSA,
                op_t,
            ),
            (
                sys::cublasLtMatmulDescAttributes_t::CUBLASLT_MATMUL_DESC_TRANSB,
                op_n,
            ),
        ] {
            // SAFETY: `g.desc` is live; the attribute is a 4-byte cublasOperation_t.
            unsafe {
                result::set_matmul_desc_attribute(
                    g.desc,
                    attr,
                    (&op) as *const i32 as *const c_void,
                    std::mem::size_of::<i32>(),
                )
            }
            .map_err(|e| lt("cublasLtMatmulDescSetAttribute", e))?;
        }
        // W: K x N col-major (ld K), A: K x M (ld K), D: N x M (ld N).
        for (i, (rows, cols, ld)) in [(k64, n64, k64), (k64, m64, k64), (n64, m64, n64)]
            .into_iter()
            .enumerate()
        {
            g.layouts[i] = result::create_matrix_layout(bf16, rows, cols, ld as i64)
                .map_err(|e| lt("cublasLtMatrixLayoutCreate", e))?;
        }
        let pref = Pref(
            result::create_matmul_pref().map_err(|e| lt("cublasLtMatmulPreferenceCreate", e))?,
        );
        let ws = WORKSPACE_BYTES;
        // SAFETY: `pref.0` is live; the attribute is a size_t.
        unsafe {
            result::set_matmul_pref_attribute(
                pref.0,
                sys::cublasLtMatmulPreferenceAttributes_t::CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                (&ws) as *const usize as *const c_void,
                std::mem::size_of::<usize>(),
            )
        }
        .map_err(|e| lt("cublasLtMatmulPreferenceSetAttribute", e))?;
        // SAFETY: the handle, descriptor, layouts and preference are live.
        let heuristic = unsafe {
            result::get_matmul_algo_heuristic(
                self.handle,
                g.desc,
                g.layouts[0],
                g.layouts[1],
                g.layouts[2],
                g.layouts[2],
                pref.0,
            )
        }
        .map_err(|e| lt("cublasLtMatmulAlgoGetHeuristic", e))?;
        g.algo = Some(heuristic.algo);
        Ok(g)
    }
}

impl Drop for CublasLt {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtCreate and destroyed once; errors at teardown are ignored.
        let _ = unsafe { result::destroy_handle(self.handle) };
    }
}

/// Makes libcublasLt loadable by cudarc: present on the loader path already (`Ok(None)`), or
/// preloaded by full path from a CUDA toolkit or the nvidia-cublas wheel of a Python venv
/// (`Ok(Some(path))`). Once a library is loaded, dlopen by its soname finds it, so cudarc's own
/// lookup by name then succeeds.
fn find_library() -> Result<Option<PathBuf>, String> {
    if probe::cublaslt_present() {
        return Ok(None);
    }
    let names = cudarc::get_lib_name_candidates("cublasLt");
    let dirs = candidate_dirs();
    for dir in &dirs {
        for name in &names {
            let path = dir.join(name);
            if !path.is_file() {
                continue;
            }
            // SAFETY: loading libcublasLt runs only its own initialisers; it is kept loaded
            // for the life of the process (forgotten below), as cudarc expects of its libraries.
            let lib = unsafe {
                libloading::os::unix::Library::open(
                    Some(&path),
                    libloading::os::unix::RTLD_NOW | libloading::os::unix::RTLD_GLOBAL,
                )
            };
            if let Ok(lib) = lib {
                std::mem::forget(lib);
                if probe::cublaslt_present() {
                    return Ok(Some(path));
                }
            }
        }
    }
    Err(format!(
        "libcublasLt was not found on the loader path nor in {} (set LD_LIBRARY_PATH to its directory)",
        dirs.iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    ))
}

/// Directories where CUDA toolkits and NVIDIA's Python wheels put libcublasLt.
fn candidate_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    for var in ["CUDA_HOME", "CUDA_PATH", "CUDA_ROOT"] {
        if let Some(root) = std::env::var_os(var) {
            dirs.push(Path::new(&root).join("lib64"));
            dirs.push(Path::new(&root).join("lib"));
        }
    }
    dirs.push(PathBuf::from("/usr/local/cuda/lib64"));
    dirs.push(PathBuf::from("/usr/local/cuda/targets/x86_64-linux/lib"));
    // The nvidia-cublas wheel: nvidia/cu13/lib (CUDA 13 wheels) or nvidia/cublas/lib.
    let mut venvs = Vec::new();
    if let Some(v) = std::env::var_os("VIRTUAL_ENV") {
        venvs.push(PathBuf::from(v));
    }
    venvs.push(PathBuf::from("/opt/torch/.venv"));
    for venv in venvs {
        let Ok(entries) = std::fs::read_dir(venv.join("lib")) else {
            continue;
        };
        for e in entries.flatten() {
            let site = e.path().join("site-packages").join("nvidia");
            dirs.push(site.join("cu13").join("lib"));
            dirs.push(site.join("cublas").join("lib"));
        }
    }
    dirs
}

fn bind(cuda: &CudaDevice) -> Result<(), String> {
    cuda.context()
        .bind_to_thread()
        .map_err(|e| format!("binding the CUDA context: {e}"))
}

struct Pref(sys::cublasLtMatmulPreference_t);

impl Drop for Pref {
    fn drop(&mut self) {
        // SAFETY: created by cublasLtMatmulPreferenceCreate and destroyed once.
        let _ = unsafe { result::destroy_matmul_pref(self.0) };
    }
}

/// One planned GEMM shape.
#[derive(Debug)]
pub struct LtGemm<'a> {
    lt: &'a CublasLt,
    /// (M, N, K).
    shape: (usize, usize, usize),
    desc: sys::cublasLtMatmulDesc_t,
    /// W, A, D.
    layouts: [sys::cublasLtMatrixLayout_t; 3],
    algo: Option<sys::cublasLtMatmulAlgo_t>,
}

impl LtGemm<'_> {
    /// Enqueues `d = a · w^T` on Calico's stream. `a` is [M, K], `w` [N, K], `d` [M, N], all
    /// contiguous bf16 tensors of the planned shape on the same CUDA device.
    pub fn run(&self, a: &Tensor, w: &Tensor, d: &Tensor) -> calico::Result<()> {
        let (m, n, k) = self.shape;
        let ptr = |t: &Tensor, name: &str, rows: usize, cols: usize| {
            if t.dtype() != DType::BF16
                || t.shape() != [rows, cols]
                || t.strides() != [cols, 1]
                || t.device_id() != self.lt.device
            {
                return Err(calico::Error::shape(format!(
                    "cuBLASLt {name}: expected a contiguous bf16 [{rows}, {cols}] tensor on {}, got {} {:?} strides {:?} on {}",
                    self.lt.device,
                    t.dtype(),
                    t.shape(),
                    t.strides(),
                    t.device_id()
                )));
            }
            t.device_ptr()
                .ok_or_else(|| calico::Error::unsupported("cuBLASLt needs CUDA tensors"))
        };
        let (a, w, d) = (ptr(a, "A", m, k)?, ptr(w, "W", n, k)?, ptr(d, "D", m, n)?);
        let ws = self.lt.workspace.device_ptr().unwrap_or(0);
        let algo = self
            .algo
            .as_ref()
            .ok_or_else(|| calico::Error::unsupported("cuBLASLt found no algorithm"))?;
        let (alpha, beta) = (1.0f32, 0.0f32);
        // SAFETY: the descriptors and layouts are live and describe the buffers, whose shapes,
        // strides, dtype and device were checked above; the workspace
        // holds WORKSPACE_BYTES; the stream belongs to the bound context of these buffers.
        unsafe {
            result::matmul(
                self.lt.handle,
                self.desc,
                (&alpha) as *const f32 as *const c_void,
                (&beta) as *const f32 as *const c_void,
                w as usize as *const c_void,
                self.layouts[0],
                a as usize as *const c_void,
                self.layouts[1],
                d as usize as *const c_void,
                self.layouts[2],
                d as usize as *mut c_void,
                self.layouts[2],
                algo,
                ws as usize as *mut c_void,
                WORKSPACE_BYTES,
                self.lt.stream,
            )
        }
        .map_err(|e| calico::Error::Runtime {
            backend: "cuda",
            call: "cublasLtMatmul".into(),
            message: e.to_string(),
        })
    }
}

impl Drop for LtGemm<'_> {
    fn drop(&mut self) {
        for l in self.layouts {
            if !l.is_null() {
                // SAFETY: created by cublasLtMatrixLayoutCreate and destroyed once.
                let _ = unsafe { result::destroy_matrix_layout(l) };
            }
        }
        if !self.desc.is_null() {
            // SAFETY: created by cublasLtMatmulDescCreate and destroyed once.
            let _ = unsafe { result::destroy_matmul_desc(self.desc) };
        }
    }
}
