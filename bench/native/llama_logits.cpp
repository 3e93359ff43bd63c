// The logits llama.cpp computes for a token sequence, for the parity checks (bench/check_lowbit_parity.py):
// one llama_decode of every token with an output row for each, written as float32 [T, n_vocab] to OUT.
//
//   llama_logits MODEL.gguf OUT.f32 THREADS TOKEN [TOKEN ...]
//
// Built against llama.cpp's libllama by bench/setup_peers.sh (a peer tool: never part of the package).
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "llama.h"

int main(int argc, char** argv) {
    if (argc < 5) {
        std::fprintf(stderr, "usage: %s MODEL.gguf OUT.f32 THREADS TOKEN [TOKEN ...]\n", argv[0]);
        return 2;
    }
    std::vector<llama_token> tokens;
    for (int i = 4; i < argc; i++) tokens.push_back((llama_token)std::atoi(argv[i]));
    const int n = (int)tokens.size();
    llama_backend_init();
    llama_model_params mp = llama_model_default_params();
    mp.n_gpu_layers = 0;
    llama_model* model = llama_model_load_from_file(argv[1], mp);
    if (!model) {
        std::fprintf(stderr, "llama_logits: cannot load %s\n", argv[1]);
        return 1;
    }
    llama_context_params cp = llama_context_default_params();
    cp.n_ctx = n + 16;
    cp.n_batch = cp.n_ubatch = n;
    cp.n_threads = cp.n_threads_batch = std::atoi(argv[3]);
    llama_context* ctx = llama_init_from_model(model, cp);
    if (!ctx) {
        std::fprintf(stderr, "llama_logits: cannot create a context\n");
        return 1;
    }
    llama_batch batch = llama_batch_init(n, 0, 1);
    for (int i = 0; i < n; i++) {
        batch.token[i] = tokens[i];
        batch.pos[i] = i;
        batch.n_seq_id[i] = 1;
        batch.seq_id[i][0] = 0;
        batch.logits[i] = 1;
    }
    batch.n_tokens = n;
    if (llama_decode(ctx, batch) != 0) {
        std::fprintf(stderr, "llama_logits: llama_decode failed\n");
        return 1;
    }
    const int n_vocab = llama_vocab_n_tokens(llama_model_get_vocab(model));
    FILE* f = std::fopen(argv[2], "wb");
    for (int i = 0; i < n; i++) std::fwrite(llama_get_logits_ith(ctx, i), sizeof(float), n_vocab, f);
    std::fclose(f);
    llama_batch_free(batch);
    llama_free(ctx);
    llama_model_free(model);
    llama_backend_free();
    return 0;
}
