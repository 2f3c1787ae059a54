/*
 * test_isa.cc - the CPU backend's vector paths (src/cpu/paths.h: on x86-64 baseline, avx2,
 * avx512, avx512bf16). The library picks one path a process, at its first CPU call, from the
 * CPU's features and the environment variable TDT_CPU_ISA. The paths with FMA (avx2, avx512,
 * avx512bf16) must give the same costs and gradients, bit for bit, and the baseline (no FMA: its
 * exps round differently) the same within a few ulp of each dtype (src/cpu/kernels.h).
 *
 *   CpuPaths.ForcedPathTakesEffect  tdt_cpu_isa() is the path TDT_CPU_ISA asked for, or the best
 *                                   this CPU supports where it asked for more (or nothing); the
 *                                   CPU's features are read here with the compiler's own
 *                                   __builtin_cpu_supports, independently of the library. ctest
 *                                   runs it once per path (tests/CMakeLists.txt).
 *   CpuPaths.EveryPathAgrees        runs this program once per path this CPU supports, each a
 *                                   child process with TDT_CPU_ISA set that computes a fixed set
 *                                   of problems (every dtype, vocabulary sizes around the kernels'
 *                                   group of 32 and chunk of 512, clamp, FastEmit, sigma, in
 *                                   place) and writes the results to a file; then compares the
 *                                   FMA paths' results with each other bit for bit, and the
 *                                   baseline's with theirs within kUlpTol.
 *
 * `test_isa --dump FILE` is the child: it writes tdt_cpu_isa() and the results to FILE.
 */
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "test_util.h"

extern char **environ;

using namespace tdt_test;

namespace {

// The paths of this target, lowest first (each needs what the ones before it need).
#if defined(__x86_64__) || defined(_M_X64)
const std::vector<std::string> kPaths = {"baseline", "avx2", "avx512", "avx512bf16"};
#elif defined(__aarch64__)
const std::vector<std::string> kPaths = {"neon"};
#else
const std::vector<std::string> kPaths = {"baseline"};
#endif

// The best path of kPaths this CPU (and its OS: libgcc's cpuinfo reads XCR0) supports.
std::string best_supported() {
#if defined(__x86_64__) && defined(__GNUC__)
    __builtin_cpu_init();
    const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c");
    const bool avx512 = avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl");
    const bool bf16 = avx512 && __builtin_cpu_supports("avx512bf16");
    return bf16 ? "avx512bf16" : avx512 ? "avx512" : avx2 ? "avx2" : "baseline";
#else
    return kPaths.back();
#endif
}

// What tdt_cpu_isa() must say when TDT_CPU_ISA is `want` (NULL: unset).
std::string expected_path(const char *want) {
    const std::string best = best_supported();
    for (const std::string &p : kPaths) {
        if (p == best) break;
        if (want && p == want) return p;
    }
    return best;
}

// The baseline against an FMA path: a few ulp of the dtype (costs: float32 for the 16-bit
// dtypes), relative, and for gradients a little absolute room (the blank's and the label's
// elements, differences of nearly equal terms). The float32 exps differ in their last bit or
// two, the float64 node exps of the lattice in theirs; a 16-bit gradient then rounds to one of
// two neighbours. {cost_rel, cost_abs, grad_abs, grad_rel}
Tol ulp_tol(tdt_dtype_t dt) {
    switch (dt) {
    case TDT_DTYPE_FLOAT64: return {1e-13, 1e-300, 1e-14, 1e-13};
    case TDT_DTYPE_FLOAT16: return {4e-6, 1e-30, 6e-8, 1.0 / 1024};
    case TDT_DTYPE_BFLOAT16: return {4e-6, 1e-30, 1e-12, 1.0 / 128};
    default: return {4e-6, 1e-30, 1e-12, 4e-6};
    }
}

bool has_fma(const std::string &path) { return path != "baseline"; }

// A build with TDT_NATIVE_ARCH=ON has the one path "native", which TDT_CPU_ISA does not move.
bool native_build() { return std::strcmp(tdt_cpu_isa(), "native") == 0; }

// ---- the problems every path computes ---------------------------------------------------------

struct Case {
    Problem p;
    RunOptions ro;
};

std::vector<Case> cases() {
    struct Shape {
        int64_t B, T, U, V;
        std::vector<int> durations;
        int blank;
        double scale;
    };
    // V: under one group of 32, not a multiple of it, one past 32 groups, past a 512 chunk; logits
    // of scale 12 put many exps below float's -87 and the clamp to work
    const std::vector<Shape> shapes = {{3, 9, 5, 77, {0, 1, 2, 3, 4}, 0, 1.0},
                                       {2, 6, 3, 1025, {0, 1, 2}, 1024, 2.0},
                                       {2, 5, 4, 31, {}, 3, 1.0},
                                       {2, 4, 3, 600, {1, 2}, 0, 12.0}};
    const std::vector<tdt_dtype_t> dtypes = {TDT_DTYPE_FLOAT32, TDT_DTYPE_FLOAT16, TDT_DTYPE_BFLOAT16,
                                             TDT_DTYPE_FLOAT64};
    std::vector<Case> out;
    uint64_t seed = 100;
    for (const tdt_dtype_t dt : dtypes) {
        for (const Shape &s : shapes) {
            for (int variant = 0; variant < 2; ++variant) {
                Case c;
                c.p = random_problem(seed++, s.B, s.T, s.U, s.V, s.durations, s.blank, s.scale);
                quantize_inputs(c.p, dt);
                c.ro.dtype = dt;
                if (variant == 1) {  // the options' terms, and the gradient over the logits
                    c.p.clamp = 0.01;
                    c.p.fastemit = 0.1;
                    c.p.sigma = 0.05;
                    c.ro.layout = Layout::InPlace;
                }
                out.push_back(c);
            }
        }
    }
    return out;
}

// ---- the child: results to a file ---------------------------------------------------------

void put(FILE *f, const std::vector<double> &v) {
    const uint64_t n = v.size();
    fwrite(&n, sizeof n, 1, f);
    if (n) fwrite(v.data(), sizeof(double), n, f);
}

bool get(FILE *f, std::vector<double> &v) {
    uint64_t n = 0;
    if (fread(&n, sizeof n, 1, f) != 1 || n > (1u << 28)) return false;
    v.resize(n);
    return n == 0 || fread(v.data(), sizeof(double), n, f) == n;
}

int dump(const char *path) {
    FILE *f = std::fopen(path, "wb");
    if (!f) return 2;
    std::fprintf(f, "%s\n", tdt_cpu_isa());
    for (const Case &c : cases()) {
        const Output o = run_lib(c.p, c.ro);
        const int32_t status = o.status;
        fwrite(&status, sizeof status, 1, f);
        put(f, o.costs);
        put(f, o.gtok);
        put(f, o.gdur);
    }
    return std::fclose(f) == 0 ? 0 : 2;
}

std::string self_path;  // this program (main)

// Runs this program with --dump under TDT_CPU_ISA=want; its path's name into *isa, its results
// into *outs. Empty on success, else what failed.
std::string run_child(const std::string &want, std::string *isa, std::vector<Output> *outs) {
    const std::string file = ::testing::TempDir() + "tdt_isa_" + want + "_" + std::to_string(getpid());
    std::vector<std::string> env_s;
    for (char **e = environ; *e; ++e)
        if (std::strncmp(*e, "TDT_CPU_ISA=", 12) != 0) env_s.push_back(*e);
    env_s.push_back("TDT_CPU_ISA=" + want);
    std::vector<char *> envp, argv;
    for (std::string &s : env_s) envp.push_back(&s[0]);
    envp.push_back(nullptr);
    std::string a0 = self_path, a1 = "--dump", a2 = file;
    argv = {&a0[0], &a1[0], &a2[0], nullptr};
    pid_t pid;
    if (posix_spawn(&pid, self_path.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0)
        return "cannot start " + self_path;
    int st = 0;
    if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
        return "the child for " + want + " failed (wait status " + std::to_string(st) + ")";
    FILE *f = std::fopen(file.c_str(), "rb");
    if (!f) return "no results from the child for " + want;
    char name[64] = {0};
    std::string err;
    if (!std::fgets(name, sizeof name, f)) err = "empty results from the child for " + want;
    name[std::strcspn(name, "\n")] = 0;
    *isa = name;
    outs->clear();
    const size_t n = cases().size();
    for (size_t i = 0; err.empty() && i < n; ++i) {
        Output o;
        int32_t status = 0;
        if (fread(&status, sizeof status, 1, f) != 1 || !get(f, o.costs) || !get(f, o.gtok) || !get(f, o.gdur))
            err = "truncated results from the child for " + want;
        o.status = static_cast<tdt_status_t>(status);
        outs->push_back(o);
    }
    std::fclose(f);
    std::remove(file.c_str());
    return err;
}

// ---- tests --------------------------------------------------------------------------------

TEST(CpuPaths, ForcedPathTakesEffect) {
    const char *want = std::getenv("TDT_CPU_ISA");
    if (native_build()) GTEST_SKIP() << "a TDT_NATIVE_ARCH build: one path, \"native\"";
    EXPECT_STREQ(tdt_cpu_isa(), expected_path(want).c_str())
        << "TDT_CPU_ISA=" << (want ? want : "(unset)") << "; the best path this CPU supports: "
        << best_supported();
    // the choice holds for the process, and a computation runs on it
    const Problem p = random_problem(7, 2, 5, 3, 70, {0, 1, 2});
    RunOptions ro;
    ro.dtype = TDT_DTYPE_FLOAT32;
    const Output o = run_lib(p, ro);
    EXPECT_EQ(o.status, TDT_STATUS_SUCCESS) << o.error;
    EXPECT_STREQ(tdt_cpu_isa(), expected_path(want).c_str()) << "the path changed after a computation";
}

TEST(CpuPaths, EveryPathAgrees) {
    if (native_build()) GTEST_SKIP() << "a TDT_NATIVE_ARCH build: one path, \"native\"";
    std::vector<std::string> paths;  // those this CPU supports
    for (const std::string &path : kPaths)
        if (expected_path(path.c_str()) == path) paths.push_back(path);
    if (paths.size() < 2) GTEST_SKIP() << "one path on this target and CPU (" << paths[0] << ")";
    const std::vector<Case> cs = cases();
    std::vector<Output> first_fma, baseline;
    std::string first_fma_path;
    for (const std::string &path : paths) {
        std::string isa;
        std::vector<Output> outs;
        const std::string err = run_child(path, &isa, &outs);
        ASSERT_TRUE(err.empty()) << err;
        ASSERT_EQ(isa, path) << "TDT_CPU_ISA=" << path << " ran another path";
        for (size_t i = 0; i < cs.size(); ++i)
            ASSERT_EQ(outs[i].status, TDT_STATUS_SUCCESS) << path << ", " << cs[i].p.describe();
        if (!has_fma(path)) {
            baseline = outs;
        } else if (first_fma.empty()) {
            first_fma = outs;
            first_fma_path = path;
        } else {
            for (size_t i = 0; i < cs.size(); ++i)
                expect_bitwise(outs[i], first_fma[i], cs[i].p,
                               path + " against " + first_fma_path + ", " + dtype_name(cs[i].ro.dtype) +
                                   ", " + layout_name(cs[i].ro.layout) + ", " + cs[i].p.describe());
        }
    }
    if (!baseline.empty() && !first_fma.empty())
        for (size_t i = 0; i < cs.size(); ++i)
            expect_near(baseline[i], first_fma[i], cs[i].p, ulp_tol(cs[i].ro.dtype),
                        "baseline against " + first_fma_path + ", " + dtype_name(cs[i].ro.dtype) + ", " +
                            layout_name(cs[i].ro.layout) + ", " + cs[i].p.describe());
    RecordProperty("paths", static_cast<int>(paths.size()));
}

}  // namespace

int main(int argc, char **argv) {
    if (argc == 3 && std::strcmp(argv[1], "--dump") == 0) return dump(argv[2]);
    char buf[4096];
    const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
    self_path = n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string(argv[0]);
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
