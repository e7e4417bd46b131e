//! The model zoo computes what torchvision computes from the same weights: weights converted
//! from torchvision models (random, with random batch-norm statistics) by
//! `tools/torchvision_to_oar.py` load through `Model::load` and give torchvision's logits.
//! Committed fixtures (`tests/fixtures/zoo`) cover small configurations of DenseNet,
//! ShuffleNetV2, MobileNetV2/V3 and ViT; every zoo model at full size is checked by
//!
//! ```text
//! python3 tools/torchvision_to_oar.py --all /tmp/zoo      # needs torch + torchvision
//! OAR_ZOO_DIR=/tmp/zoo cargo test --release -p oar --test framework -- --ignored zoo::
//! ```
//!
//! The text models likewise give PyTorch's and HuggingFace's logits: committed fixtures of a
//! tiny `BertForSequenceClassification` (plain, and with token types and an attention mask), the
//! seq2seq Transformer on `torch.nn.Transformer` and bidirectional LSTM / GRU classifiers (mean
//! and last pooling), written by `python3 tools/torch_text_to_oar.py` (needs torch + transformers).
//!
//! LeNet and MobileNetV1 follow `paddle.vision.models`: `python3 tools/paddle_to_oar.py` (needs
//! paddlepaddle) writes committed fixtures of LeNet and MobileNetV1 at scale 0.25 from Paddle, and
//! with `--all OUT` MobileNetV1 at full size, which the ignored test below also reads.
//!
//! Parameter counts and state-dict names against the references are unit tests beside each model.

use oar::nn::Layer;
use oar::text::models as tm;
use oar::vision::models as vm;
use oar::{Model, Tensor};
use std::collections::BTreeMap;
use std::path::Path;
use std::rc::Rc;

type Build = fn() -> oar::Result<Box<dyn Layer>>;

fn boxed<L: Layer + 'static>(l: oar::Result<L>) -> oar::Result<Box<dyn Layer>> {
    Ok(Box::new(l?))
}

/// Load `<dir>/<name>.safetensors` into the model `build` makes, run it on the input of
/// `<name>.io.safetensors` and compare with torchvision's logits, within `tol` of the largest.
fn check(dir: &Path, name: &str, build: Build, tol: f64) {
    let mut model = Model::new(build().unwrap_or_else(|e| panic!("{name}: {e}")));
    model
        .load(dir.join(format!("{name}.safetensors")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let io = oar::load(dir.join(format!("{name}.io.safetensors"))).unwrap();
    let x = oar::Tensor::from_data(io["input"].clone());
    let want = io["logits"].to_f64_vec();
    let got = model.predict([Ok(x)]).unwrap().remove(0);
    assert_eq!(got.numel(), want.len(), "{name}: output {:?}", got.shape());
    let got = got.try_data().unwrap().to_f64_vec();
    assert_logits_close(name, &got, &want, tol);
}

/// `got` within `tol` of the largest of `want` (+ 1e-5), elementwise.
fn assert_logits_close(name: &str, got: &[f64], want: &[f64], tol: f64) {
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs()));
    let err = got.iter().zip(want).fold(0f64, |m, (a, b)| m.max((a - b).abs()));
    eprintln!("{name}: largest logit {scale:.3}, largest difference {err:.2e}");
    assert!(
        err <= tol * scale + 1e-5,
        "{name}: logits differ by {err} (largest {scale})"
    );
}

/// The committed small configurations, within 1e-4 of the largest logit.
#[test]
fn committed_torchvision_fixtures_match() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zoo");
    let cases: [(&str, Build); 5] = [
        ("densenet_tiny", || {
            boxed(vm::DenseNet::new(
                &vm::DenseNetConfig::new(8, &[2, 2], 16).bn_size(2),
                10,
            ))
        }),
        ("shufflenet_v2_tiny", || {
            boxed(vm::ShuffleNetV2::new([1, 1, 1], [8, 16, 32, 64, 128], 10))
        }),
        ("mobilenet_v3_small_025", || boxed(vm::mobilenet_v3_small(0.25, 10))),
        ("mobilenet_v2_025", || boxed(vm::mobilenet_v2(0.25, 10))),
        ("vit_tiny", || {
            boxed(vm::VisionTransformer::new(&vm::ViTConfig::new(32, 8, 2, 2, 32, 64, 10)))
        }),
    ];
    for (name, build) in cases {
        check(&dir, name, build, 1e-4);
    }
}

/// LeNet and MobileNetV1 (scale 0.25) with weights and logits from `paddle.vision.models`,
/// within 1e-4 of the largest logit.
#[test]
fn committed_paddle_fixtures_match() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zoo");
    check(&dir, "paddle_lenet", || boxed(vm::lenet(10)), 1e-4);
    check(
        &dir,
        "paddle_mobilenet_v1_025",
        || boxed(vm::mobilenet_v1(0.25, 10)),
        1e-4,
    );
}

/// Every zoo model at full size against torchvision (see the module docs), within 1e-3 of the
/// largest logit; cases whose files are absent are skipped, at least one must be there.
#[test]
#[ignore = "needs OAR_ZOO_DIR from tools/torchvision_to_oar.py --all"]
fn every_zoo_model_matches_torchvision() {
    let dir = std::path::PathBuf::from(std::env::var("OAR_ZOO_DIR").expect("set OAR_ZOO_DIR"));
    let cases: Vec<(&str, Build)> = vec![
        ("alexnet", || boxed(vm::alexnet(1000))),
        ("vgg11", || boxed(vm::vgg11(false, 1000))),
        ("vgg11_bn", || boxed(vm::vgg11(true, 1000))),
        ("vgg13", || boxed(vm::vgg13(false, 1000))),
        ("vgg13_bn", || boxed(vm::vgg13(true, 1000))),
        ("vgg16", || boxed(vm::vgg16(false, 1000))),
        ("vgg16_bn", || boxed(vm::vgg16(true, 1000))),
        ("vgg19", || boxed(vm::vgg19(false, 1000))),
        ("vgg19_bn", || boxed(vm::vgg19(true, 1000))),
        ("resnet18", || boxed(vm::resnet18(1000))),
        ("resnet34", || boxed(vm::resnet34(1000))),
        ("resnet50", || boxed(vm::resnet50(1000))),
        ("resnet101", || boxed(vm::resnet101(1000))),
        ("resnet152", || boxed(vm::resnet152(1000))),
        ("resnext50_32x4d", || boxed(vm::resnext50_32x4d(1000))),
        ("wide_resnet50_2", || boxed(vm::wide_resnet50_2(1000))),
        ("mobilenet_v2", || boxed(vm::mobilenet_v2(1.0, 1000))),
        ("mobilenet_v3_small", || boxed(vm::mobilenet_v3_small(1.0, 1000))),
        ("mobilenet_v3_large", || boxed(vm::mobilenet_v3_large(1.0, 1000))),
        ("shufflenet_v2_x0_5", || boxed(vm::shufflenet_v2_x0_5(1000))),
        ("shufflenet_v2_x1_0", || boxed(vm::shufflenet_v2_x1_0(1000))),
        ("shufflenet_v2_x1_5", || boxed(vm::shufflenet_v2_x1_5(1000))),
        ("shufflenet_v2_x2_0", || boxed(vm::shufflenet_v2_x2_0(1000))),
        ("squeezenet1_0", || boxed(vm::squeezenet1_0(1000))),
        ("squeezenet1_1", || boxed(vm::squeezenet1_1(1000))),
        ("densenet121", || boxed(vm::densenet121(1000))),
        ("googlenet", || boxed(vm::googlenet(1000, false))),
        ("inception_v3", || boxed(vm::inception_v3(1000, true))),
        ("vit_b_16", || boxed(vm::vit_b_16(1000))),
        ("fcn_resnet50", || boxed(vm::fcn_resnet50(21, true))),
        // From tools/paddle_to_oar.py --all.
        ("paddle_mobilenet_v1", || boxed(vm::mobilenet_v1(1.0, 1000))),
    ];
    let mut ran = 0;
    for (name, build) in cases {
        if dir.join(format!("{name}.safetensors")).exists() {
            check(&dir, name, build, 1e-3);
            ran += 1;
        } else {
            eprintln!("{name}: no files in {}, skipped", dir.display());
        }
    }
    assert!(ran > 0, "no converted models in {}", dir.display());
}

/// A model owned together with the test, so that `Model::load` (which owns its network) can
/// fill its parameters and the test can still call its multi-input methods: the wrapper lists
/// the model's parameters and buffers as its own (the same handles).
struct Shared<L>(Rc<L>);

impl<L: Layer> Layer for Shared<L> {
    fn forward(&self, x: &Tensor) -> oar::Result<Tensor> {
        self.0.forward(x)
    }

    fn own_parameters(&self) -> Vec<(String, Tensor)> {
        self.0.named_parameters()
    }

    fn own_buffers(&self) -> Vec<(String, Tensor)> {
        self.0.named_buffers()
    }
}

/// [`check`] for models whose logits need more than one input: `model` is put in eval mode,
/// loads `<name>.safetensors` through `Model::load`, and `run` computes its logits from the
/// tensors of `<name>.io.safetensors`; they must be within `tol` of the largest logit.
fn check_with<L: Layer + 'static>(
    dir: &Path,
    name: &str,
    mut model: L,
    run: impl Fn(&L, &BTreeMap<String, Tensor>) -> oar::Result<Tensor>,
    tol: f64,
) {
    model.eval();
    let model = Rc::new(model);
    Model::new(Shared(Rc::clone(&model)))
        .load(dir.join(format!("{name}.safetensors")))
        .unwrap_or_else(|e| panic!("{name}: {e}"));
    let io: BTreeMap<String, Tensor> = oar::load(dir.join(format!("{name}.io.safetensors")))
        .unwrap()
        .into_iter()
        .map(|(k, v)| (k, Tensor::from_data(v)))
        .collect();
    let got = {
        let _ng = oar::no_grad();
        run(&model, &io).unwrap_or_else(|e| panic!("{name}: {e}"))
    };
    let want = io["logits"].try_data().unwrap().to_f64_vec();
    assert_eq!(got.shape(), io["logits"].shape(), "{name}: output shape");
    let got = got.try_data().unwrap().to_f64_vec();
    assert_logits_close(name, &got, &want, tol);
}

/// The tiny BERT of `tools/torch_text_to_oar.py`.
fn bert_tiny() -> tm::BertConfig {
    tm::BertConfig {
        vocab_size: 64,
        hidden_size: 32,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        intermediate_size: 64,
        max_position_embeddings: 32,
        num_labels: 3,
        ..tm::BertConfig::default()
    }
}

/// The recurrent classifiers of `tools/torch_text_to_oar.py`: two bidirectional layers.
fn rnn_tiny(pooling: tm::Pooling) -> tm::RnnClassifierConfig {
    tm::RnnClassifierConfig {
        vocab_size: 20,
        embed_dim: 8,
        hidden_size: 6,
        num_layers: 2,
        bidirectional: true,
        num_classes: 3,
        pooling,
    }
}

/// The text models against PyTorch / HuggingFace from the same weights
/// (`tools/torch_text_to_oar.py`): HuggingFace's `BertForSequenceClassification` without and
/// with token types and an attention mask, `torch.nn.Transformer` inside the seq2seq model (its
/// padding and causal masks too), and LSTM / GRU classifiers with both poolings, within 1e-4 of
/// the largest logit.
#[test]
fn committed_torch_text_fixtures_match() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/zoo");
    let cases: [(&str, Build); 5] = [
        ("bert_tiny", || {
            boxed(tm::BertForSequenceClassification::new(&bert_tiny()))
        }),
        ("lstm_classifier_tiny", || {
            boxed(tm::LstmClassifier::new(&rnn_tiny(tm::Pooling::Mean)))
        }),
        ("lstm_classifier_last_tiny", || {
            boxed(tm::LstmClassifier::new(&rnn_tiny(tm::Pooling::Last)))
        }),
        ("gru_classifier_tiny", || {
            boxed(tm::GruClassifier::new(&rnn_tiny(tm::Pooling::Mean)))
        }),
        ("gru_classifier_last_tiny", || {
            boxed(tm::GruClassifier::new(&rnn_tiny(tm::Pooling::Last)))
        }),
    ];
    for (name, build) in cases {
        check(&dir, name, build, 1e-4);
    }
    check_with(
        &dir,
        "bert_tiny_masked",
        tm::BertForSequenceClassification::new(&bert_tiny()).unwrap(),
        |m, io| m.forward_with_mask(&io["input"], Some(&io["token_type_ids"]), Some(&io["attention_mask"])),
        1e-4,
    );
    let seq2seq = tm::TransformerSeq2Seq::new(&tm::Seq2SeqConfig {
        src_vocab_size: 16,
        tgt_vocab_size: 18,
        max_length: 10,
        pad_id: Some(0),
        transformer: oar::nn::TransformerConfig {
            d_model: 16,
            nhead: 2,
            num_encoder_layers: 2,
            num_decoder_layers: 2,
            dim_feedforward: 32,
            ..Default::default()
        },
    })
    .unwrap();
    // The file's position encodings (the tool's table) are oar's own.
    let file = oar::load(dir.join("transformer_seq2seq_tiny.safetensors")).unwrap();
    let own = seq2seq.state_dict()["position_encoding"]
        .try_data()
        .unwrap()
        .to_f64_vec();
    let theirs = file["position_encoding"].to_f64_vec();
    assert_eq!(own.len(), theirs.len());
    assert!(
        own.iter().zip(&theirs).all(|(a, b)| (a - b).abs() < 1e-6),
        "position encodings"
    );
    check_with(
        &dir,
        "transformer_seq2seq_tiny",
        seq2seq,
        |m, io| m.forward_pair(&io["src"], &io["tgt"]),
        1e-4,
    );
}
