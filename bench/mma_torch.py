"""PyTorch scaled_dot_product_attention beside the tensor-core kernels
(bench/mma_check.cu bench): the same shapes (batch * seqlen = 16k,
heads * d = 2048), forward and backward TFLOP/s per SDPA backend.
Run on the GPU machine by bench/mma_h200.sh."""
import sys
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def timeit(fn, reps=10, warm=3):
    for _ in range(warm):
        fn()
    ts = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ts.append(a.elapsed_time(b))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    quick = len(sys.argv) > 1 and sys.argv[1] == "quick"
    ns = [4096, 8192] if quick else [1024, 2048, 4096, 8192, 16384]
    backends = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}
    print("%-6s %-5s %-4s %-6s %-6s %9s %9s" % ("sdpa", "dtype", "d", "causal", "N", "fwd_TF", "bwd_TF"))
    for name, be in backends.items():
        for dt in (torch.bfloat16, torch.float16):
            for d in (64, 128):
                for causal in (0, 1):
                    for n in ns:
                        b, h = 16384 // n, 2048 // d
                        q, k, v, do = (torch.randn(b, n, h, d, device="cuda", dtype=dt).transpose(1, 2) for _ in range(4))
                        q.requires_grad_(); k.requires_grad_(); v.requires_grad_()
                        fl = 4.0 * b * h * n * n * d / (2 if causal else 1)
                        try:
                            with sdpa_kernel([be]):
                                f = lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal))
                                tf = timeit(f)
                                out = f()
                                tb = timeit(lambda: torch.autograd.grad(out, (q, k, v), do, retain_graph=True))
                            print("%-6s %-5s %-4d %-6d %-6d %9.1f %9.1f" % (name, str(dt)[6:], d, causal, n,
                                  fl / tf / 1e9, 2.5 * fl / tb / 1e9), flush=True)
                        except RuntimeError as e:
                            print("%-6s %-5s %-4d %-6d %-6d unavailable: %s" % (name, str(dt)[6:], d, causal, n, str(e)[:60]))
                        del q, k, v, do
    if True:
        # float32 SDPA (math/efficient), for the f32 target of the general kernels
        for d in (64, 128):
            for causal in (0, 1):
                n = 4096
                b, h = 16384 // n, 2048 // d
                q, k, v = (torch.randn(b, h, n, d, device="cuda") for _ in range(3))
                fl = 4.0 * b * h * n * n * d / (2 if causal else 1)
                tf = timeit(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal)))
                print("%-6s %-5s %-4d %-6d %-6d %9.1f %9s" % ("f32", "float32", d, causal, n, fl / tf / 1e9, "-"))


if __name__ == "__main__":
    main()
