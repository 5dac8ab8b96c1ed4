import fsp from "node:fs/promises";

/** Byte sizes of GGUF scalar value types (8 = string and 9 = array are variable). */
const scalarSize: Record<number, number> = {
  0: 1,
  1: 1,
  2: 2,
  3: 2,
  4: 4,
  5: 4,
  6: 4,
  7: 1,
  10: 8,
  11: 8,
  12: 8,
};
const UINT32 = 4;
const STRING = 8;

/** Where a metadata key's value sits in a GGUF file and its type, or undefined if the key is absent. */
async function findValue(
  file: fsp.FileHandle,
  key: string,
): Promise<{ offset: number; type: number } | undefined> {
  // The metadata precedes the tensor data; grow the window until the key section fits.
  for (let windowSize = 1 << 20; ; windowSize *= 4) {
    const buffer = Buffer.alloc(windowSize);
    const { bytesRead } = await file.read(buffer, 0, windowSize, 0);
    const data = buffer.subarray(0, bytesRead);
    if (data.toString("latin1", 0, 4) !== "GGUF") throw new Error("not a GGUF file");
    let offset = 8;
    const need = (n: number) => {
      if (offset + n > data.length) throw new RangeError("window");
    };
    const readU64 = () => {
      need(8);
      const value = Number(data.readBigUInt64LE(offset));
      offset += 8;
      return value;
    };
    const readString = () => {
      const length = readU64();
      need(length);
      const text = data.toString("utf8", offset, offset + length);
      offset += length;
      return text;
    };
    const skipValue = (type: number): void => {
      if (type === 8) readString();
      else if (type === 9) {
        need(4);
        const itemType = data.readUInt32LE(offset);
        offset += 4;
        const count = readU64();
        if (itemType in scalarSize) {
          need(count * scalarSize[itemType]!);
          offset += count * scalarSize[itemType]!;
        } else for (let i = 0; i < count; i++) skipValue(itemType);
      } else {
        const size = scalarSize[type];
        if (size === undefined) throw new Error(`unknown GGUF value type ${type}`);
        need(size);
        offset += size;
      }
    };
    try {
      readU64(); // tensor count
      const kvCount = readU64();
      for (let i = 0; i < kvCount; i++) {
        const name = readString();
        need(4);
        const type = data.readUInt32LE(offset);
        offset += 4;
        if (name === key) return { offset, type };
        skipValue(type);
      }
      return undefined;
    } catch (error) {
      if (error instanceof RangeError && bytesRead === windowSize) continue;
      throw error;
    }
  }
}

async function findUint32(file: fsp.FileHandle, key: string): Promise<number | undefined> {
  const found = await findValue(file, key);
  return found?.type === UINT32 ? found.offset : undefined;
}

/** Reads a uint32 metadata value (e.g. `llama.context_length`). */
export async function readGgufUint32(path: string, key: string): Promise<number | undefined> {
  const file = await fsp.open(path, "r");
  try {
    const offset = await findUint32(file, key);
    if (offset === undefined) return undefined;
    const buffer = Buffer.alloc(4);
    await file.read(buffer, 0, 4, offset);
    return buffer.readUInt32LE(0);
  } finally {
    await file.close();
  }
}

/** Reads a string metadata value (e.g. `general.architecture`). */
export async function readGgufString(path: string, key: string): Promise<string | undefined> {
  const file = await fsp.open(path, "r");
  try {
    const found = await findValue(file, key);
    if (found?.type !== STRING) return undefined;
    const header = Buffer.alloc(8);
    await file.read(header, 0, 8, found.offset);
    const length = Number(header.readBigUInt64LE(0));
    const text = Buffer.alloc(length);
    await file.read(text, 0, length, found.offset + 8);
    return text.toString("utf8");
  } finally {
    await file.close();
  }
}

/** Overwrites a uint32 metadata value in place (same size, so nothing else moves). Returns false if absent. */
export async function writeGgufUint32(path: string, key: string, value: number): Promise<boolean> {
  const file = await fsp.open(path, "r+");
  try {
    const offset = await findUint32(file, key);
    if (offset === undefined) return false;
    const buffer = Buffer.alloc(4);
    buffer.writeUInt32LE(value, 0);
    await file.write(buffer, 0, 4, offset);
    await file.sync();
    return true;
  } finally {
    await file.close();
  }
}
