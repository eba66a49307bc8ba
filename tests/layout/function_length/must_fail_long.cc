// Must NOT pass layout:function_length (ctest layout:function_length_must_fail):
// Sum below is 160 lines, over the 150-line bound. What comes before it is
// what the scanner must see through without losing count: a raw string and
// literals holding braces, a constructor's brace initializers, a lambda.
#include <string>

namespace fixture {

const char* kPage = R"html(<script>function f() { return "}"; }</script>)html";
const char kOpen = '{';

struct Point {
  Point(int x, int y) : x_{x}, y_{y} {}
  int x_;
  int y_;
};

inline int Twice(int v) {
  auto add = [](int a, int b) { return a + b; };
  return add(v, v);  // "}" in a comment: }
}

int Sum(int n) {
  int total = 0;
  total += n * 0 + static_cast<int>(kOpen);
  total += n * 1 + static_cast<int>(kOpen);
  total += n * 2 + static_cast<int>(kOpen);
  total += n * 3 + static_cast<int>(kOpen);
  total += n * 4 + static_cast<int>(kOpen);
  total += n * 5 + static_cast<int>(kOpen);
  total += n * 6 + static_cast<int>(kOpen);
  total += n * 7 + static_cast<int>(kOpen);
  total += n * 8 + static_cast<int>(kOpen);
  total += n * 9 + static_cast<int>(kOpen);
  total += n * 10 + static_cast<int>(kOpen);
  total += n * 11 + static_cast<int>(kOpen);
  total += n * 12 + static_cast<int>(kOpen);
  total += n * 13 + static_cast<int>(kOpen);
  total += n * 14 + static_cast<int>(kOpen);
  total += n * 15 + static_cast<int>(kOpen);
  total += n * 16 + static_cast<int>(kOpen);
  total += n * 17 + static_cast<int>(kOpen);
  total += n * 18 + static_cast<int>(kOpen);
  total += n * 19 + static_cast<int>(kOpen);
  total += n * 20 + static_cast<int>(kOpen);
  total += n * 21 + static_cast<int>(kOpen);
  total += n * 22 + static_cast<int>(kOpen);
  total += n * 23 + static_cast<int>(kOpen);
  total += n * 24 + static_cast<int>(kOpen);
  total += n * 25 + static_cast<int>(kOpen);
  total += n * 26 + static_cast<int>(kOpen);
  total += n * 27 + static_cast<int>(kOpen);
  total += n * 28 + static_cast<int>(kOpen);
  total += n * 29 + static_cast<int>(kOpen);
  total += n * 30 + static_cast<int>(kOpen);
  total += n * 31 + static_cast<int>(kOpen);
  total += n * 32 + static_cast<int>(kOpen);
  total += n * 33 + static_cast<int>(kOpen);
  total += n * 34 + static_cast<int>(kOpen);
  total += n * 35 + static_cast<int>(kOpen);
  total += n * 36 + static_cast<int>(kOpen);
  total += n * 37 + static_cast<int>(kOpen);
  total += n * 38 + static_cast<int>(kOpen);
  total += n * 39 + static_cast<int>(kOpen);
  total += n * 40 + static_cast<int>(kOpen);
  total += n * 41 + static_cast<int>(kOpen);
  total += n * 42 + static_cast<int>(kOpen);
  total += n * 43 + static_cast<int>(kOpen);
  total += n * 44 + static_cast<int>(kOpen);
  total += n * 45 + static_cast<int>(kOpen);
  total += n * 46 + static_cast<int>(kOpen);
  total += n * 47 + static_cast<int>(kOpen);
  total += n * 48 + static_cast<int>(kOpen);
  total += n * 49 + static_cast<int>(kOpen);
  total += n * 50 + static_cast<int>(kOpen);
  total += n * 51 + static_cast<int>(kOpen);
  total += n * 52 + static_cast<int>(kOpen);
  total += n * 53 + static_cast<int>(kOpen);
  total += n * 54 + static_cast<int>(kOpen);
  total += n * 55 + static_cast<int>(kOpen);
  total += n * 56 + static_cast<int>(kOpen);
  total += n * 57 + static_cast<int>(kOpen);
  total += n * 58 + static_cast<int>(kOpen);
  total += n * 59 + static_cast<int>(kOpen);
  total += n * 60 + static_cast<int>(kOpen);
  total += n * 61 + static_cast<int>(kOpen);
  total += n * 62 + static_cast<int>(kOpen);
  total += n * 63 + static_cast<int>(kOpen);
  total += n * 64 + static_cast<int>(kOpen);
  total += n * 65 + static_cast<int>(kOpen);
  total += n * 66 + static_cast<int>(kOpen);
  total += n * 67 + static_cast<int>(kOpen);
  total += n * 68 + static_cast<int>(kOpen);
  total += n * 69 + static_cast<int>(kOpen);
  total += n * 70 + static_cast<int>(kOpen);
  total += n * 71 + static_cast<int>(kOpen);
  total += n * 72 + static_cast<int>(kOpen);
  total += n * 73 + static_cast<int>(kOpen);
  total += n * 74 + static_cast<int>(kOpen);
  total += n * 75 + static_cast<int>(kOpen);
  total += n * 76 + static_cast<int>(kOpen);
  total += n * 77 + static_cast<int>(kOpen);
  total += n * 78 + static_cast<int>(kOpen);
  total += n * 79 + static_cast<int>(kOpen);
  total += n * 80 + static_cast<int>(kOpen);
  total += n * 81 + static_cast<int>(kOpen);
  total += n * 82 + static_cast<int>(kOpen);
  total += n * 83 + static_cast<int>(kOpen);
  total += n * 84 + static_cast<int>(kOpen);
  total += n * 85 + static_cast<int>(kOpen);
  total += n * 86 + static_cast<int>(kOpen);
  total += n * 87 + static_cast<int>(kOpen);
  total += n * 88 + static_cast<int>(kOpen);
  total += n * 89 + static_cast<int>(kOpen);
  total += n * 90 + static_cast<int>(kOpen);
  total += n * 91 + static_cast<int>(kOpen);
  total += n * 92 + static_cast<int>(kOpen);
  total += n * 93 + static_cast<int>(kOpen);
  total += n * 94 + static_cast<int>(kOpen);
  total += n * 95 + static_cast<int>(kOpen);
  total += n * 96 + static_cast<int>(kOpen);
  total += n * 97 + static_cast<int>(kOpen);
  total += n * 98 + static_cast<int>(kOpen);
  total += n * 99 + static_cast<int>(kOpen);
  total += n * 100 + static_cast<int>(kOpen);
  total += n * 101 + static_cast<int>(kOpen);
  total += n * 102 + static_cast<int>(kOpen);
  total += n * 103 + static_cast<int>(kOpen);
  total += n * 104 + static_cast<int>(kOpen);
  total += n * 105 + static_cast<int>(kOpen);
  total += n * 106 + static_cast<int>(kOpen);
  total += n * 107 + static_cast<int>(kOpen);
  total += n * 108 + static_cast<int>(kOpen);
  total += n * 109 + static_cast<int>(kOpen);
  total += n * 110 + static_cast<int>(kOpen);
  total += n * 111 + static_cast<int>(kOpen);
  total += n * 112 + static_cast<int>(kOpen);
  total += n * 113 + static_cast<int>(kOpen);
  total += n * 114 + static_cast<int>(kOpen);
  total += n * 115 + static_cast<int>(kOpen);
  total += n * 116 + static_cast<int>(kOpen);
  total += n * 117 + static_cast<int>(kOpen);
  total += n * 118 + static_cast<int>(kOpen);
  total += n * 119 + static_cast<int>(kOpen);
  total += n * 120 + static_cast<int>(kOpen);
  total += n * 121 + static_cast<int>(kOpen);
  total += n * 122 + static_cast<int>(kOpen);
  total += n * 123 + static_cast<int>(kOpen);
  total += n * 124 + static_cast<int>(kOpen);
  total += n * 125 + static_cast<int>(kOpen);
  total += n * 126 + static_cast<int>(kOpen);
  total += n * 127 + static_cast<int>(kOpen);
  total += n * 128 + static_cast<int>(kOpen);
  total += n * 129 + static_cast<int>(kOpen);
  total += n * 130 + static_cast<int>(kOpen);
  total += n * 131 + static_cast<int>(kOpen);
  total += n * 132 + static_cast<int>(kOpen);
  total += n * 133 + static_cast<int>(kOpen);
  total += n * 134 + static_cast<int>(kOpen);
  total += n * 135 + static_cast<int>(kOpen);
  total += n * 136 + static_cast<int>(kOpen);
  total += n * 137 + static_cast<int>(kOpen);
  total += n * 138 + static_cast<int>(kOpen);
  total += n * 139 + static_cast<int>(kOpen);
  total += n * 140 + static_cast<int>(kOpen);
  total += n * 141 + static_cast<int>(kOpen);
  total += n * 142 + static_cast<int>(kOpen);
  total += n * 143 + static_cast<int>(kOpen);
  total += n * 144 + static_cast<int>(kOpen);
  total += n * 145 + static_cast<int>(kOpen);
  total += n * 146 + static_cast<int>(kOpen);
  total += n * 147 + static_cast<int>(kOpen);
  total += n * 148 + static_cast<int>(kOpen);
  total += n * 149 + static_cast<int>(kOpen);
  total += n * 150 + static_cast<int>(kOpen);
  total += n * 151 + static_cast<int>(kOpen);
  total += n * 152 + static_cast<int>(kOpen);
  total += n * 153 + static_cast<int>(kOpen);
  total += n * 154 + static_cast<int>(kOpen);
  return total;
}

}  // namespace fixture
