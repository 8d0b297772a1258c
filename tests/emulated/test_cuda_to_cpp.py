#!/usr/bin/env python3
"""Tests of cuda_to_cpp.py: what it rewrites, and that anything else that looks like a launch,
a shared memory declaration or inline PTX is an error naming the file and line."""
import os
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cuda_to_cpp import TransformError, transform  # noqa: E402


class Rewrites(unittest.TestCase):
    def test_launch_keeps_lines_and_arguments(self):
        src = "void f() {\n  k<8, X><<<grid, 256, 0,\n      stream>>>(a,\n                   b);\n}\n"
        out = transform(src, "f.cu")
        self.assertEqual(out.count("\n"), src.count("\n"))
        self.assertIn('::emu::launch(::emu::LaunchSite{"k<8, X>", __FILE__, __LINE__, __PRETTY_FUNCTION__}, '
                      "k<8, X>, ::emu::LaunchConfig::make(grid, 256, 0,\n      stream), a,\n                   b)", out)

    def test_launch_in_a_comment_or_string_is_left_alone(self):
        src = '// k<<<1, 2>>>(x);\nconst char* s = "k<<<1, 2>>>(x);";\n'
        self.assertEqual(transform(src, "f.cu"), src)

    def test_shared_declarations(self):
        out = transform("extern __shared__ __align__(128) unsigned char smem[];\n"
                        "__shared__ __align__(16) float red[8][kTile];\n__shared__ double d[4];\n", "f.cu")
        self.assertIn("unsigned char* const smem = ::emu::dynamic_shared<unsigned char, 128>();", out)
        self.assertIn("float (&red)[8][kTile] = ::emu::static_shared<float[8][kTile], 16>([] {});", out)
        self.assertIn("double (&d)[4] = ::emu::static_shared<double[4], 0>([] {});", out)
        out = transform("__global__ void k() {\n  __shared__ int count;\n}\n", "k.cu")
        self.assertIn("int &count = ::emu::static_shared<int, 0>([] {});", out)

    def test_ptx(self):
        out = transform('asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\\n"\n'
                        '  : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(addr));\n'
                        'asm volatile("cp.async.wait_group %0;\\n" ::"n"(N) : "memory");\n', "f.cuh")
        self.assertIn("::emu::ptx::ldmatrix_sync_aligned_m8n8_x4_trans_shared_b16((r[0]), (r[1]), (r[2]), (r[3]), "
                      "(addr))", out)
        self.assertIn("::emu::ptx::cp_async_wait_group((N));", out)

    def test_cuda_arch(self):
        self.assertEqual(transform("#if __CUDA_ARCH__ >= 900\n", "f.cu"), "#if PRIMUS_EMU_CUDA_ARCH >= 900\n")


class Errors(unittest.TestCase):
    def check(self, src, needle):
        with self.assertRaises(TransformError) as e:
            transform(src, "k.cu")
        self.assertIn(needle, str(e.exception))
        self.assertIn("k.cu:", str(e.exception))

    def test_launch_inside_an_expression(self):
        self.check("void f() {\n  x = (k<<<1, 2>>>(a), 3);\n}\n", "k.cu:2")

    def test_launch_through_the_runtime_api(self):
        self.check("void f() { cudaLaunchKernel(k, 1, 1, args, 0, 0); }\n", "not supported")

    def test_unknown_ptx_instruction(self):
        self.check('void f() {\n  asm volatile("wgmma.fence.sync.aligned;\\n" ::: "memory");\n}\n', "k.cu:2")

    def test_several_ptx_instructions(self):
        self.check('asm("{ mov.u32 %0, 1; mov.u32 %0, 2; }" : "=r"(x));\n', "single PTX instructions")

    def test_shared_with_an_initializer(self):
        self.check("__shared__ int x = 0;\n", "unexpected form")

    def test_shared_with_several_names(self):
        self.check("__global__ void k() {\n  __shared__ int a, b;\n}\n", "k.cu:2")


if __name__ == "__main__":
    unittest.main()
