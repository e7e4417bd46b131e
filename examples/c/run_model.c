/* run_model: load a model compiled by `oar compile --emit so`, describe its inputs and
 * outputs, run it, and print the outputs.
 *
 * Build (DIR holds model.so and model.h, written by `oar compile m.oar --emit so -o DIR/model.so`):
 *   cc -O2 -I DIR -DOAR_MODEL_HEADER='"model.h"' examples/c/run_model.c DIR/model.so \
 *      -Wl,-rpath,DIR -o run_model
 * Run:
 *   ./run_model [--weights FILE.weights] [--threads N] [INPUT0.bin INPUT1.bin ...]
 * INPUTi.bin holds input i's raw bytes (little-endian, C order, exactly as many bytes as the
 * header's OAR_MODEL_INPUTi_BYTES). Without files the inputs get a fixed pattern.
 *
 * Output, per model output: a line `output NAME DTYPE [d0,d1,...]`, then one line with its
 * values (%.9g for floats; f16/bf16 are converted to float). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifndef OAR_MODEL_HEADER
#define OAR_MODEL_HEADER "model.h"
#endif
#include OAR_MODEL_HEADER

static void print_type(const oar_tensor* t) {
    printf("%s [", oar_dtype_name(t->dtype));
    for (int32_t d = 0; d < t->rank; d++) printf(d ? ",%lld" : "%lld", (long long)t->shape[d]);
    printf("]");
}

static size_t elements(const oar_tensor* t) {
    size_t n = 1;
    for (int32_t d = 0; d < t->rank; d++) n *= (size_t)t->shape[d];
    return n;
}

static float half_to_float(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1f, man = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000u | (man << 13);
    } else if (exp == 0) {
        float f = (float)man / 16777216.0f; /* man * 2^-24 */
        return sign ? -f : f;
    } else {
        bits = sign | ((exp + 112) << 23) | (man << 13);
    }
    float f;
    memcpy(&f, &bits, 4);
    return f;
}

static double element(const oar_tensor* t, size_t k) {
    const unsigned char* p = (const unsigned char*)t->data;
    switch (t->dtype) {
    case OAR_DTYPE_F32: { float v; memcpy(&v, p + 4 * k, 4); return v; }
    case OAR_DTYPE_F64: { double v; memcpy(&v, p + 8 * k, 8); return v; }
    case OAR_DTYPE_F16: { uint16_t v; memcpy(&v, p + 2 * k, 2); return half_to_float(v); }
    case OAR_DTYPE_BF16: { uint16_t v; memcpy(&v, p + 2 * k, 2); uint32_t b = (uint32_t)v << 16; float f; memcpy(&f, &b, 4); return f; }
    case OAR_DTYPE_I8: return (int8_t)p[k];
    case OAR_DTYPE_U8: return p[k];
    case OAR_DTYPE_I32: { int32_t v; memcpy(&v, p + 4 * k, 4); return v; }
    case OAR_DTYPE_I64: { int64_t v; memcpy(&v, p + 8 * k, 8); return (double)v; }
    case OAR_DTYPE_BOOL: return p[k] != 0;
    default: return 0;
    }
}

/* A fixed pattern: small values of the input's dtype. */
static void fill_pattern(oar_tensor* t) {
    unsigned char* p = (unsigned char*)t->data;
    for (size_t k = 0; k < elements(t); k++) {
        double v = (double)((k * 37) % 17) / 8.0 - 1.0;
        int64_t i = (int64_t)((k * 37) % 17) - 8;
        switch (t->dtype) {
        case OAR_DTYPE_F32: { float f = (float)v; memcpy(p + 4 * k, &f, 4); break; }
        case OAR_DTYPE_F64: memcpy(p + 8 * k, &v, 8); break;
        case OAR_DTYPE_I8: p[k] = (unsigned char)(int8_t)i; break;
        case OAR_DTYPE_U8: p[k] = (unsigned char)(i + 8); break;
        case OAR_DTYPE_I32: { int32_t x = (int32_t)i; memcpy(p + 4 * k, &x, 4); break; }
        case OAR_DTYPE_I64: memcpy(p + 8 * k, &i, 8); break;
        case OAR_DTYPE_BOOL: p[k] = (unsigned char)(k % 2); break;
        default: memset(p, 0, t->byte_size); return; /* f16/bf16: zeros */
        }
    }
}

static int read_file(const char* path, void* data, size_t n) {
    FILE* f = fopen(path, "rb");
    if (!f) { fprintf(stderr, "error: cannot open %s\n", path); return -1; }
    size_t got = fread(data, 1, n, f);
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (got != n || extra) {
        fprintf(stderr, "error: %s: expected exactly %zu bytes\n", path, n);
        return -1;
    }
    return 0;
}

int main(int argc, char** argv) {
    const char* weights = NULL;
    size_t threads = 0;
    int first_file = 1;
    while (first_file < argc && strncmp(argv[first_file], "--", 2) == 0) {
        if (!strcmp(argv[first_file], "--weights") && first_file + 1 < argc) {
            weights = argv[first_file + 1];
        } else if (!strcmp(argv[first_file], "--threads") && first_file + 1 < argc) {
            threads = (size_t)strtoul(argv[first_file + 1], NULL, 10);
        } else {
            fprintf(stderr, "usage: %s [--weights FILE] [--threads N] [INPUT.bin ...]\n", argv[0]);
            return 2;
        }
        first_file += 2;
    }

    char* err = NULL;
    oar_model* m = oar_model_create(weights, &err);
    if (!m) {
        fprintf(stderr, "error: %s\n", err);
        oar_string_free(err);
        return 1;
    }
    if (threads) oar_model_set_threads(m, threads);

    size_t n_in = oar_model_num_inputs(m), n_out = oar_model_num_outputs(m);
    printf("model %s: %zu inputs, %zu outputs\n", OAR_MODEL_NAME, n_in, n_out);
    if ((size_t)(argc - first_file) != 0 && (size_t)(argc - first_file) != n_in) {
        fprintf(stderr, "error: %d input files given, the model takes %zu\n", argc - first_file, n_in);
        oar_model_destroy(m);
        return 1;
    }

    oar_tensor* ins = calloc(n_in ? n_in : 1, sizeof(oar_tensor));
    oar_tensor* outs = calloc(n_out ? n_out : 1, sizeof(oar_tensor));
    int status = 1;
    for (size_t i = 0; i < n_in; i++) {
        oar_model_input_info(m, i, &ins[i]);
        printf("input %zu %s ", i, ins[i].name);
        print_type(&ins[i]);
        printf(" (%zu bytes)\n", ins[i].byte_size);
        ins[i].data = malloc(ins[i].byte_size ? ins[i].byte_size : 1);
        if (argc > first_file) {
            if (read_file(argv[first_file + (int)i], ins[i].data, ins[i].byte_size)) goto done;
        } else {
            fill_pattern(&ins[i]);
        }
    }
    for (size_t i = 0; i < n_out; i++) {
        oar_model_output_info(m, i, &outs[i]);
        outs[i].data = malloc(outs[i].byte_size ? outs[i].byte_size : 1);
    }

    if (oar_model_run(m, ins, n_in, outs, n_out, &err) != 0) {
        fprintf(stderr, "error: %s\n", err);
        oar_string_free(err);
        goto done;
    }
    for (size_t i = 0; i < n_out; i++) {
        printf("output %s ", outs[i].name);
        print_type(&outs[i]);
        printf("\n");
        for (size_t k = 0; k < elements(&outs[i]); k++) printf(k ? " %.9g" : "%.9g", element(&outs[i], k));
        printf("\n");
    }
    status = 0;
done:
    for (size_t i = 0; i < n_in; i++) free(ins[i].data);
    for (size_t i = 0; i < n_out; i++) free(outs[i].data);
    free(ins);
    free(outs);
    oar_model_destroy(m);
    return status;
}
