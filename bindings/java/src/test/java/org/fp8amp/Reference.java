package org.fp8amp;

/** Independent Java codecs (docs/numerics.md): BF16 and E4M3 encoding, round to nearest even. */
final class Reference {
    private Reference() {}

    /** float32 -> BF16 code, RNE, NaN -> canonical quiet NaN with its sign. */
    static short bf16(float x) {
        int bits = Float.floatToRawIntBits(x);
        if (Float.isNaN(x)) return (short) (((bits >>> 16) & 0x8000) | 0x7FC0);
        int rounded = bits + 0x7FFF + ((bits >>> 16) & 1);
        return (short) (rounded >>> 16);
    }

    static float bf16ToFloat(short code) {
        return Float.intBitsToFloat((code & 0xFFFF) << 16);
    }

    /** float32 -> E4M3 (e4m3fn) code: RNE, saturating to +-448, NaN -> S.1111.111. */
    static byte e4m3(float y) {
        int sign = (Float.floatToRawIntBits(y) >>> 24) & 0x80;
        if (Float.isNaN(y)) return (byte) (sign | 0x7F);
        double a = Math.abs((double) y);
        int code;
        if (a >= 448.0) {
            code = 0x7E;
        } else if (a < 0x1p-6) {
            code = (int) Math.rint(a / 0x1p-9); // subnormals: m * 2^-9 (8 rounds up to 2^-6, code 8)
        } else {
            int e = Math.getExponent(a);
            double m = a / Math.scalb(1.0, e); // [1, 2)
            int q = (int) Math.rint((m - 1.0) * 8.0);
            if (q == 8) {
                q = 0;
                e += 1;
            }
            code = ((e + 7) << 3) | q;
            if (code > 0x7E) code = 0x7E; // 464 and up round past 448: saturate
        }
        return (byte) (sign | code);
    }

    static float e4m3ToFloat(byte code) {
        int c = code & 0xFF;
        int sign = c & 0x80;
        int e = (c >>> 3) & 0xF;
        int m = c & 7;
        if (e == 0xF && m == 7) return Float.NaN;
        double v = e == 0 ? m * 0x1p-9 : (1.0 + m / 8.0) * Math.scalb(1.0, e - 7);
        return (float) (sign != 0 ? -v : v);
    }
}
