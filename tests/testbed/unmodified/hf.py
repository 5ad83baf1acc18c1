"""A Hugging Face Trainer as its user writes it: a tiny GPT-2 (built from a config, no
download), ``save_total_limit=2``, resumed with ``resume_from_checkpoint=True`` (the newest
``checkpoint-<step>`` of its output folder) whenever it holds one."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Log, Pace, arguments, digest  # noqa: E402

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def main() -> None:
    a = arguments(__doc__).parse_args()
    log = Log(a.record)
    import torch
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_utils import get_last_checkpoint

    os.makedirs(a.out, exist_ok=True)
    last = get_last_checkpoint(a.out)
    log("start", resume_from=last)
    pace = Pace(a.step_time)

    class Record(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            if last:
                log("resume", step=state.global_step, path=last)

        def on_step_end(self, args, state, control, **kw):
            pace()
            log("step", step=state.global_step)

        def on_save(self, args, state, control, **kw):
            log("save", step=state.global_step, path=os.path.join(a.out, f"checkpoint-{state.global_step}"))

    torch.manual_seed(a.seed)
    cfg = GPT2Config(vocab_size=100, n_positions=32, n_embd=16, n_layer=2, n_head=2, bos_token_id=0, eos_token_id=0,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = GPT2LMHeadModel(cfg)
    g = torch.Generator().manual_seed(a.seed)
    data = [{"input_ids": x, "labels": x} for x in torch.randint(0, 100, (256, 16), generator=g)]
    args = TrainingArguments(output_dir=a.out, max_steps=a.max_steps, save_strategy="steps", save_steps=a.save_every,
                             save_total_limit=2, per_device_train_batch_size=4, logging_strategy="no", report_to=[],
                             use_cpu=True, disable_tqdm=True, seed=a.seed, data_seed=a.seed, dataloader_num_workers=0)
    trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=[Record()])
    trainer.train(resume_from_checkpoint=True if last else None)
    log("done", step=trainer.state.global_step, h=digest(trainer.model.state_dict()))


if __name__ == "__main__":
    main()
