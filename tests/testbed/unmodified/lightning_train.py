"""A Lightning trainer as its user writes it: ``ModelCheckpoint(dirpath=--out, save_last=True,
save_top_k=2, monitor="step", mode="max", every_n_train_steps=--save-every)`` (an epoch is that
many steps: a save on an epoch's last batch resumes exactly), and ``trainer.fit(...,
ckpt_path="last")``, which resumes from the newest ``last*.ckpt`` of that folder when it holds one."""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Log, Pace, arguments, digest  # noqa: E402


def main() -> None:
    a = arguments(__doc__).parse_args()
    rank = int(os.environ.get("RANK", "0"))
    log = Log(a.record, rank)
    import torch
    import lightning as L
    from lightning.pytorch.callbacks import Callback, ModelCheckpoint
    torch.set_num_threads(1)
    pace = Pace(a.step_time)

    class Net(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(16, 16)

        def training_step(self, batch, i):
            (x,) = batch
            return ((self.layer(x) - x) ** 2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)

    class Record(Callback):
        """The trainer's record; a save is recorded once its files are written: Lightning calls
        on_save_checkpoint before it writes them, and runs ModelCheckpoint's own batch end
        after every other callback's, so at the next batch's start (or the training's end)."""
        saved = None

        def on_train_start(self, trainer, module):
            if trainer.ckpt_path:
                log("resume", step=trainer.global_step, path=trainer.ckpt_path)

        def on_train_batch_start(self, trainer, module, batch, i):
            self.written()

        def on_train_batch_end(self, trainer, module, outputs, batch, i):
            pace()
            log("step", step=trainer.global_step)

        def on_save_checkpoint(self, trainer, module, checkpoint):
            self.saved = trainer.global_step

        def on_train_end(self, trainer, module):
            self.written()

        def written(self):
            if self.saved is not None:
                log("save", step=self.saved)
                self.saved = None

    L.seed_everything(a.seed, verbose=False)
    model = Net()
    g = torch.Generator().manual_seed(a.seed)
    data = torch.utils.data.TensorDataset(torch.randn(a.save_every * 8, 16, generator=g))
    loader = torch.utils.data.DataLoader(data, batch_size=8, shuffle=False)  # an epoch: --save-every steps
    ckpt = ModelCheckpoint(dirpath=a.out, save_last=True, save_top_k=2, monitor="step", mode="max",
                           every_n_train_steps=a.save_every)
    trainer = L.Trainer(max_steps=a.max_steps, accelerator="cpu", devices=1, logger=False, deterministic=True,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[ckpt, Record()])
    log("start")
    trainer.fit(model, loader, ckpt_path="last")
    log("done", step=trainer.global_step, h=digest(model.state_dict()))


if __name__ == "__main__":
    main()
