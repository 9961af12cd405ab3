// Greedy decode with llama.cpp through node-llama-cpp's prebuilt CPU binaries (no build, no download).
//
// Reads a JSON job on stdin: {"gguf": PATH, "prompts": [[token ids]...], "tokens": N, "threads": T,
// "lookup": {"pattern_min": 1, "pattern_max": 0, "predict_max": 5} (optional)} and writes one JSON line
// on stdout: {"tokens_per_s": X, "outputs": [[token ids]...], "llama": {...}, "predictions": {...}}.
// With "lookup", the sequence uses node-llama-cpp's InputLookupTokenPredictor (prompt lookup decoding:
// llama.cpp verifies the proposed tokens in one batch) over each prompt's tokens; "predictions" holds
// its counts (validated, refuted, used, unused).
// Decode tokens/s counts from the first generated token to the last, summed over the prompts
// (prompt processing excluded), as in bench_vs_llamacpp.py. EOS is ignored (yielded and fed back).
// "llama" also carries llama.cpp's own perf counters ("eval time": the decode steps alone, summed over
// the prompts, without the Node overhead).
//
// node-llama-cpp is found through NODE_PATH or a normal module lookup, e.g.
//     mkdir -p /opt/llamacpp && cd /opt/llamacpp && npm init -y && \
//         NODE_LLAMA_CPP_SKIP_DOWNLOAD=true npm install --ignore-scripts node-llama-cpp@3.22.1
//     NODE_PATH=/opt/llamacpp/node_modules node benchmarks/llamacpp_node_runner.mjs < job.json
import { createRequire } from "node:module";
import path from "node:path";
import { performance } from "node:perf_hooks";
import { readFileSync } from "node:fs";

// ES modules ignore NODE_PATH, so resolve the package from there by hand.
const require = createRequire(path.join(process.cwd(), "noop.js"));
const entry = require.resolve("node-llama-cpp", {
    paths: [...(process.env.NODE_PATH ?? "").split(path.delimiter).filter(Boolean), process.cwd()],
});
const { getLlama, LlamaLogLevel, InputLookupTokenPredictor } = await import(entry);

const job = JSON.parse(readFileSync(0, "utf8"));
const threads = job.threads || 0;
const logs = [];
const llama = await getLlama({
    gpu: false,
    build: "never",
    usePrebuiltBinaries: true,
    skipDownload: true,
    maxThreads: threads,
    logLevel: LlamaLogLevel.info, // info carries the perf counters; keep it, print only errors
    logger: (level, message) => {
        if (level === LlamaLogLevel.error || level === LlamaLogLevel.fatal) console.error(message);
        else logs.push(message);
    },
});
const model = await llama.loadModel({ modelPath: job.gguf, gpuLayers: 0 });
const context = await model.createContext({
    contextSize: 1024,
    batchSize: 512,
    performanceTracking: true,
    threads: threads ? { ideal: threads, min: threads } : undefined,
});
const lookup = job.lookup
    ? new InputLookupTokenPredictor({
          patternLength: { min: job.lookup.pattern_min ?? 1, max: job.lookup.pattern_max ?? 0 },
          predictionLength: { min: 1, max: job.lookup.predict_max ?? 3 },
      })
    : undefined;
const sequence = context.getSequence(lookup ? { tokenPredictor: lookup } : undefined);

let decodeMs = 0;
let produced = 0;
const outputs = [];
for (const prompt of job.prompts) {
    await sequence.clearHistory();
    lookup?.updateInputTokens(prompt);
    const out = [];
    let first = null;
    for await (const token of sequence.evaluate(prompt, { temperature: 0, yieldEogToken: true })) {
        if (first === null) first = performance.now();
        out.push(token);
        if (out.length === job.tokens) break;
    }
    decodeMs += performance.now() - first;
    produced += out.length - 1;
    outputs.push(out);
}

logs.length = 0;
await context.printTimings();
const timings = logs
    .join("\n")
    .split(/\n|(?=llama_perf_context_print:)/)
    .filter((line) => /eval time/.test(line))
    .map((line) => line.replace(/^llama_perf_context_print:\s*/, "").replace(/\s+/g, " ").trim());
const info = {
    package: `node-llama-cpp ${JSON.parse(readFileSync(path.join(path.dirname(entry), "..", "package.json"), "utf8")).version}`,
    llama_cpp_release: llama.llamaCppRelease?.release,
    build_type: llama.buildType,
    gpu: llama.gpu,
    cpu_math_cores: llama.cpuMathCores,
    system_info: llama.systemInfo,
    context_threads: context.currentThreads,
    perf: timings,
};
const predictions = lookup ? { ...sequence.tokenPredictions } : undefined;
await context.dispose();
await model.dispose();
await llama.dispose();
console.log(JSON.stringify({ tokens_per_s: produced / (decodeMs / 1000), outputs, llama: info, predictions }));
