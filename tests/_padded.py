"""A batch of token rows right-padded to one width, as Hugging Face collators pad them: an
attention mask, labels -100 where padded (shared by the Step client tests)."""
import torch


def padded(vocab: int, lengths=(3, 40, 17, 40), width=40, seed=1) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (len(lengths), width), generator=g)
    mask = (torch.arange(width)[None] < torch.tensor(lengths)[:, None]).long()
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}
