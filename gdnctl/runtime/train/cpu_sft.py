"""The sft job on device cpu: transformers' Qwen3.5 vision-language class trained with plain torch (DDP on gloo), on
records with images (runtime/data/images.py) and plain prompt/response records beside them.

Megatron-Core cannot run here (its GDN layer needs the CUDA kernels of FLA or FlashQLA); transformers'
`Qwen3_5ForConditionalGeneration` has pure-torch GDN and vision paths, so on CPU the same HF architecture, weights
and names train with torch instead, in fp32, with the Megatron trainer's optimizer settings (AdamW, betas 0.9/0.95,
weight decay 0.01, grad clip 1.0) and lr schedule.

Rows are padded (BSHD): the class computes its multimodal rotary positions per row from the attention mask
(get_rope_index), so rows cannot be packed. A step takes train.global_batch_size samples of the seeded epoch
order, split over the ranks and into micro-batches of train.micro_batch_size; the loss is the mean over the step's
trained tokens (the responses: prompts and their image tokens take no loss).

train.vision: frozen leaves the vision tower as loaded (no gradient, no optimizer state), and saves carry the
source checkpoint's tower over byte for byte (runtime/model/passthrough.py); train trains it, and saves write it
in its HF names (`model.visual.*`) beside the language model. A run from random weights has no source to carry
from, so its saves write the tower either way. Every save writes the image processor's preprocessor_config.json.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import torch
import torch.distributed as dist

from gdnctl.errors import GdnctlError
from gdnctl.knowledge import PREPROCESSOR_FILE
from gdnctl.runtime.data import IGNORE_INDEX, PAD_TOKEN_ID, images, load_tokenizer
from gdnctl.runtime.model import checkpoint, durable_files, vision_language
from gdnctl.runtime.train.lr_schedule import lr_of, set_lr
from gdnctl.runtime.train.metrics import MetricsLog
from gdnctl.runtime.train.trainer import ADAM_BETAS, CLIP_GRAD, WEIGHT_DECAY
from gdnctl.schema import EngineConfig, image_data


class CpuSftError(GdnctlError):
    """The CPU sft job cannot run as configured."""


class CpuSft:
    def __init__(self, config: EngineConfig, config_path: Path) -> None:
        if config.train.images is None or config.train.data_path is None:
            raise CpuSftError(
                "sft on cpu trains transformers' vision-language class on records with images: set train.data_path "
                "and train.images (docs/images.md)."
            )
        self.config = config
        self.run_dir = config_path.parent
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        train = config.train
        limits = image_data.ImageLimits(**train.images.model_dump())
        tokenizer = load_tokenizer(train.tokenizer_path or config.model.path or "")
        reader = images.ImageDocuments(config.model.vision, tokenizer, limits, train.seq_length)
        self.documents = reader.read(train.data_path)
        self.eval_documents = reader.read(config.eval.data_path) if config.eval is not None else []

        model = vision_language.vision_language_model(config)
        initial = Path(config.model.path) if config.model.path else None
        checkpoint.check_source_outside_save_dir(config.model.path, train.save_dir)
        save_dir = Path(train.save_dir) if train.save_dir else None
        resume = checkpoint.latest_checkpoint(save_dir) if save_dir is not None else None
        self.reads = (initial, resume)
        for directory in (initial, resume):
            if directory is not None:
                vision_language.load_vision_language(model, directory)
        source = resume or initial
        self.source = vision_language.run_source(config.model, source)
        self.train_tower = train.vision == "train"
        # A frozen tower is carried over from the source; with none to carry from, it is written.
        self.writes_tower = self.train_tower or not self.source.has_vision_tower
        model.model.visual.requires_grad_(self.train_tower)
        self.module = model
        self.model = (
            torch.nn.parallel.DistributedDataParallel(model, find_unused_parameters=self.train_tower)
            if self.world_size > 1
            else model
        )
        self.optimizer = torch.optim.AdamW(
            [param for param in model.parameters() if param.requires_grad],
            lr=train.lr,
            betas=ADAM_BETAS,
            weight_decay=WEIGHT_DECAY,
        )
        self._orders: dict[int, torch.Tensor] = {}
        self.skipped = 0  # non-finite steps not applied (train.skip_nonfinite_steps)
        self.step = 0
        if resume is not None:
            self.step = checkpoint.read_training_state(resume, self.world_size)["iteration"]
            checkpoint.load_training_state(resume, self.optimizer, device="cpu")
        self.metrics = MetricsLog(config, self.run_dir, enabled=self.rank == 0, group="train")
        self.metrics.resumed_at(self.step)

    def step_documents(self, step: int) -> list[images.ImageDocument]:
        """This rank's samples of step `step` (0-based): global_batch_size samples of the epochs' seeded orders,
        one after the other, split evenly over the ranks."""
        size = self.config.train.global_batch_size
        picked = [self._sample(step * size + index) for index in range(size)]
        share = size // self.world_size
        return picked[self.rank * share : (self.rank + 1) * share]

    def _sample(self, position: int) -> images.ImageDocument:
        epoch, index = divmod(position, len(self.documents))
        if epoch not in self._orders:
            seeded = torch.Generator().manual_seed(self.config.train.seed + epoch)
            self._orders = {epoch: torch.randperm(len(self.documents), generator=seeded)}  # one epoch at a time
        return self.documents[int(self._orders[epoch][index])]

    def _micro_batches(self, documents: list[images.ImageDocument]) -> Iterator[list[images.ImageDocument]]:
        size = self.config.train.micro_batch_size
        for start in range(0, len(documents), size):
            yield documents[start : start + size]

    def _loss_sum(self, model, documents: list[images.ImageDocument]) -> tuple[torch.Tensor, int]:
        batch = images.image_batch(documents, PAD_TOKEN_ID)
        logits = model(**batch.model_inputs()).logits.float()
        loss = torch.nn.functional.cross_entropy(
            logits.flatten(0, 1), batch.labels.flatten(), ignore_index=IGNORE_INDEX, reduction="sum"
        )
        return loss, batch.trained_tokens

    def train_step(self) -> dict[str, float]:
        """One optimizer step -> its stats (the same on every rank)."""
        self.model.train()
        set_lr(self.optimizer, lr_of(self.config.train, self.step))
        self.optimizer.zero_grad(set_to_none=True)
        documents = self.step_documents(self.step)
        micro = list(self._micro_batches(documents))
        tokens = torch.tensor([float(sum(int(d.trained[1:].sum()) for d in documents))], dtype=torch.float64)
        dist.all_reduce(tokens)
        total = max(float(tokens), 1.0)
        loss_sum = torch.zeros(2, dtype=torch.float64)  # [loss sum, image tokens] on this rank
        for index, batch in enumerate(micro):
            last = index == len(micro) - 1
            with nullcontext() if last or self.world_size == 1 else self.model.no_sync():
                loss, _ = self._loss_sum(self.model, batch)
                # DDP averages gradients over ranks; the loss is the step's mean over every rank's tokens.
                (loss * self.world_size / total).backward()
            loss_sum += torch.tensor([float(loss.detach()), sum(d.image_tokens for d in batch)], dtype=torch.float64)
        grad_norm = torch.nn.utils.clip_grad_norm_(
            [param for param in self.module.parameters() if param.requires_grad], CLIP_GRAD
        )
        dist.all_reduce(loss_sum)
        # Every rank sees the same sums and norm (DDP averaged the gradients), so all skip or stop together.
        finite = bool(torch.isfinite(loss_sum[0])) and bool(torch.isfinite(grad_norm))
        if finite:
            self.optimizer.step()
        elif self.skipped < self.config.train.skip_nonfinite_steps:
            self.skipped += 1
        else:
            raise CpuSftError(
                f"step {self.step + 1}'s loss or gradient is not finite (after {self.skipped} skipped step(s), "
                f"train.skip_nonfinite_steps {self.config.train.skip_nonfinite_steps}); lower train.lr or check "
                "the data."
            )
        self.step += 1
        return {
            "loss": float(loss_sum[0]) / total,
            "grad_norm": float(grad_norm),
            "lr": self.optimizer.param_groups[0]["lr"],
            "trained_tokens": int(total),
            "image_tokens": int(loss_sum[1]),
            "applied": finite,
        }

    @torch.no_grad()
    def evaluate(self) -> float:
        """Mean loss per trained token over the held-out records: the file's first eval.batches global batches of
        them (all, when it holds fewer), split over the ranks."""
        self.model.eval()
        loss_sum = torch.zeros(2, dtype=torch.float64)
        held_out = self.eval_documents[: self.config.eval.batches * self.config.train.global_batch_size]
        for batch in self._micro_batches(held_out[self.rank :: self.world_size]):
            loss, tokens = self._loss_sum(self.module, batch)
            loss_sum += torch.tensor([float(loss), tokens], dtype=torch.float64)
        dist.all_reduce(loss_sum)
        return float(loss_sum[0] / loss_sum[1].clamp(min=1))

    def hf_tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights a save writes, under gdnctl's writer names: the language model, and the tower when it trains
        or has no source to be carried from. A tied LM head is the embedding, written once."""
        for name, tensor in self.module.state_dict().items():
            if name.startswith(vision_language.VISION_PREFIX) and not self.writes_tower:
                continue
            if self.config.model.tie_word_embeddings and name == "lm_head.weight":
                continue
            yield vision_language.language_name(name), tensor

    def save(self, save_dir: Path) -> None:
        directory = save_dir / checkpoint.checkpoint_name(self.step)
        checkpoint.refuse_overwriting_source(directory, self.reads)
        written = {}
        if self.rank == 0:
            written = checkpoint.save_tensors(self.hf_tensors(), directory, self.source)
            # The image processor the run used, so that the checkpoint as model.path cuts images the same way.
            processing = self.config.model.vision.preprocessor_config()
            written[PREPROCESSOR_FILE] = durable_files.write_json(directory / PREPROCESSOR_FILE, processing)
        checkpoint.save_training_state(directory, self.optimizer, {"iteration": self.step}, written)
        dist.barrier()
        if self.rank == 0:
            checkpoint.mark_latest(save_dir, directory.name)
        dist.barrier()

    def run(self) -> None:
        train = self.config.train
        save_dir = Path(train.save_dir) if train.save_dir else None
        while self.step < train.train_iters:
            started = time.perf_counter()
            stats = self.train_step()
            row = {"step": self.step, **stats, "seconds": round(time.perf_counter() - started, 4)}
            if self.config.eval is not None and self.step % self.config.eval.interval == 0:
                row["eval_loss"] = self.evaluate()
            self.metrics.log(self.step, row)
            if self.rank == 0:
                print(
                    f"step {self.step}/{train.train_iters} loss {stats['loss']:.4f} "
                    f"grad_norm {stats['grad_norm']:.3f} image_tokens {stats['image_tokens']}",
                    flush=True,
                )
            last = self.step == train.train_iters
            if save_dir is not None and (last or (train.save_interval and self.step % train.save_interval == 0)):
                self.save(save_dir)
        self.metrics.close()


def run(config: EngineConfig, config_path: Path) -> int:
    job = CpuSft(config, config_path)
    job.run()
    return 0
